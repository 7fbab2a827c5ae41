"""The GPU code path of part 4.2's pages, run by ``make gpu-check`` on a machine with GPUs.

Each check calls the same package function a page calls, with the backend forced (``nccl`` in
``make gpu-check``), so a page that would silently fall back to gloo cannot pass there; each
also checks that the device matches the backend (CUDA with NCCL). A check returns a short
Vietnamese summary of what it saw, or raises; ``run_pages`` collects one row per page. The
tests run the same checks with ``backend="gloo"`` on CPU, so the plumbing is tested everywhere.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

from . import launch


def _world(gpus: int) -> int:
    return max(1, min(gpus, 2))


def _expect_device(dev: str, backend: str) -> None:
    if dev.startswith("cuda") != (backend == "nccl"):
        raise AssertionError(f"backend {backend} nhưng thiết bị là {dev}")


def _primitives(gpus: int, backend: str, timeout: float) -> str:
    from . import bench, primitives

    ws = _world(gpus)
    res = launch.spawn(primitives.run_collectives, world_size=ws, backend=backend,
                       timeout=timeout, output="none")
    first = res[0]["all_reduce"]["after"][0]
    if first != sum(10 * r + 1 for r in range(ws)):  # rank r holds 10r + 1, 10r + 2, ...
        raise AssertionError(f"all_reduce cho {first}")
    sizes = bench.round_sizes([1 << 20, 1 << 24], ws)
    rows = launch.spawn(bench.time_collectives, sizes=sizes, world_size=ws, backend=backend,
                        timeout=timeout, output="none")[0]
    _expect_device(rows["device"], rows["backend"])
    big = rows["rows"]["all_reduce"][-1]
    return f"all_reduce {big.nbytes >> 20} MiB: {big.seconds * 1e3:.3f} ms"


def _ddp_script(gpus: int, backend: str, timeout: float) -> str:
    from .ddp_script import ScriptConfig, run

    res = launch.spawn(run, ScriptConfig(epochs=1, progress=False), world_size=_world(gpus),
                       backend=backend, timeout=timeout, output="none")
    r0 = res[0]
    _expect_device(r0["device"], r0["backend"])
    if r0["autocast"] != r0["device"].startswith("cuda"):  # 16-bit autocast on CUDA only
        raise AssertionError(f"autocast={r0['autocast']} trên {r0['device']}")
    return (f"{len(r0['losses'])} bước trên {r0['device']}, autocast {r0['amp_dtype'] or 'tắt'}, "
            f"loss cuối {r0['losses'][-1]:.4f}")


def _fsdp_script(gpus: int, backend: str, timeout: float) -> str:
    from .fsdp_script import practice_tour

    with tempfile.TemporaryDirectory() as ckpt:
        res = launch.spawn(practice_tour, ckpt, world_size=_world(gpus), backend=backend,
                           timeout=timeout, output="none")
    return f"{len(res[0])} phần chạy xong: {', '.join(res[0])}"


def _torchrun(gpus: int, backend: str, timeout: float) -> str:
    from . import torchrun, torchrun_env

    ws = _world(gpus)
    results = torchrun.run("dpbook.torchrun_env", nproc_per_node=ws, timeout=timeout,
                           backend=backend)
    records = torchrun.json_records(results, torchrun_env.TAG)
    if len(records) != ws or {r["backend"] for r in records} != {backend}:
        raise AssertionError(f"{len(records)} worker, backend {[r['backend'] for r in records]}")
    for r in records:
        _expect_device(r["device"], r["backend"])
    return f"{len(records)} worker dùng {backend}, AllReduce = {records[0]['allreduce_sum']:g}"


def _nccl_debug(gpus: int, backend: str, timeout: float) -> str:
    import os

    from . import failures

    ws = _world(gpus)
    with tempfile.TemporaryDirectory() as logs:
        with failures.env_vars(NCCL_DEBUG="INFO",
                               NCCL_DEBUG_FILE=os.path.join(logs, "nccl.%h.%p.log")):
            sums = launch.spawn(failures.all_reduce_once, world_size=ws, backend=backend,
                                timeout=timeout, output="none")
        lines = failures.read_logs(os.path.join(logs, "nccl.*.log"), max_lines=10_000)
    if sums != [ws * (ws + 1) / 2] * ws:
        raise AssertionError(f"AllReduce trả về {sums}")
    if backend == "nccl" and not any("NCCL INFO" in line for line in lines):
        raise AssertionError("NCCL_DEBUG=INFO không ghi dòng log nào")
    return f"AllReduce = {sums[0]:g}, {len(lines)} dòng log NCCL"


def _resume(gpus: int, backend: str, timeout: float) -> str:
    import json
    import os

    from . import torchrun

    ws = _world(gpus)
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "final.pt")
        torchrun.run("dpbook.resume", ["--ckpt-dir", os.path.join(work, "ckpt"), "--out", out,
                                       "--steps", 8, "--ckpt-every", 4, "--kill-rank", ws - 1,
                                       "--kill-step", 6],
                     nproc_per_node=ws, max_restarts=1, timeout=timeout, backend=backend)
        with open(os.path.join(work, "final.json"), encoding="utf-8") as f:
            attempts = json.load(f)["attempts"]
    starts = [a["from_step"] for a in attempts]
    if starts != [0, 4]:
        raise AssertionError(f"các lần chạy bắt đầu từ bước {starts}, cần [0, 4]")
    return f"{len(attempts)} lần chạy, lần sau tiếp tục từ bước {starts[-1]}"


def _lab_a(gpus: int, backend: str, timeout: float) -> str:
    from .lab_a import SOLUTION, checker

    result = checker.check(SOLUTION, nproc_per_node=_world(gpus), timeout=timeout, verbose=False,
                           backend=backend)
    if not result.passed:
        raise AssertionError(f"lời giải trượt các mục {result.failed}")
    return f"lời giải qua {len(result.items)} mục kiểm tra"


def _labs_bc(gpus: int, backend: str, timeout: float) -> str:
    from . import compare

    # Lab C's HYBRID_SHARD needs 4 ranks (a 2 x 2 mesh).
    configs = compare.LAB_B + compare.LAB_C if gpus >= 4 else compare.LAB_B
    ws = 4 if gpus >= 4 else _world(gpus)
    results = launch.spawn(compare.measure_configs, configs, world_size=ws, backend=backend,
                           timeout=timeout, output="none")
    rows = compare.collect(results, configs)
    for row in rows:
        if abs(row.volume.total - row.predicted.volume.total) > 1e-6 * row.predicted.volume.total:
            raise AssertionError(f"{row.label}: đo {row.volume.total} B, công thức "
                                 f"{row.predicted.volume.total} B")
        if (row.peak_method == "cuda") != (backend == "nccl"):
            raise AssertionError(f"{row.label}: peak đo bằng {row.peak_method}")
    return f"{len(rows)} cấu hình trên {ws} rank, giao tiếp = công thức"


PAGES: dict[str, Callable[[int, str, float], str]] = {
    "4.2.1 giao tiếp": _primitives,
    "4.2.2 DDP đầy đủ": _ddp_script,
    "4.2.3 FSDP đầy đủ": _fsdp_script,
    "4.2.4 torchrun": _torchrun,
    "4.2.5 NCCL_DEBUG": _nccl_debug,
    "4.2.6 chịu lỗi": _resume,
    "Bài A": _lab_a,
    "Bài B, C": _labs_bc,
}


def run_pages(gpus: int, backend: str = "nccl", timeout: float = 300.0) -> list[dict]:
    """One row per page: ``{"page", "ok", "detail", "seconds"}``; a failure does not stop the rest."""
    rows = []
    for page, check in PAGES.items():
        t0 = time.perf_counter()
        try:
            detail, ok = check(gpus, backend, timeout), True
        except Exception as exc:  # report every page, whatever broke
            detail, ok = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", False
        rows.append({"page": page, "ok": ok, "detail": detail,
                     "seconds": time.perf_counter() - t0})
    return rows
