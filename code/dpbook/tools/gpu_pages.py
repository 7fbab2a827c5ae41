"""The code path of part 4.2's pages, run by ``make gpu-check`` on a machine with GPUs.

Each check calls the same package function a page calls, on ``world`` ranks with the backend
forced, so a page that would silently fall back to gloo cannot pass under ``nccl``; each also
checks that the device matches the backend (CUDA with NCCL, the CPU with gloo). A check returns
a short Vietnamese summary of what it saw, or raises; ``run_pages`` collects one row per page.

``make gpu-check`` runs them with NCCL on the machine's GPUs, and with gloo in the fallbacks a
learner's GPU box takes (2 ranks with 1 GPU visible, 4 with 2), where every rank must stay off
CUDA (``launch.NO_CUDA_VAR``). The tests run them with gloo on the CPU, so the plumbing is
tested everywhere.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

from .. import launch, vi


def _expect_device(dev: str, backend: str) -> None:
    if dev.startswith("cuda") != (backend == "nccl"):
        raise AssertionError(f"backend {backend} nhưng thiết bị là {dev}")


def _expected(ws: int, backend: str) -> str:
    """The backend a run on ``ws`` ranks must report: the forced one, or what ``"auto"``
    resolves to on this machine (torchrun's workers choose alike: a GPU per worker or gloo)."""
    return launch.plan(ws, backend).backend


def _expect_run(dev: str, reported: str, ws: int, backend: str) -> None:
    if reported != _expected(ws, backend):
        raise AssertionError(f"chạy bằng {reported}, cần {_expected(ws, backend)}")
    _expect_device(dev, reported)


def _primitives(ws: int, backend: str, timeout: float) -> str:
    from .. import bench
    from ..pages import communication

    res = launch.spawn(communication.run_collectives, world_size=ws, backend=backend,
                       timeout=timeout, output="none")
    first = res[0]["all_reduce"]["after"][0]
    if first != sum(10 * r + 1 for r in range(ws)):  # rank r holds 10r + 1, 10r + 2, ...
        raise AssertionError(f"all_reduce cho {first}")
    sizes = bench.round_sizes([1 << 20, 1 << 24], ws)
    rows = launch.spawn(bench.time_collectives, sizes=sizes, world_size=ws, backend=backend,
                        timeout=timeout, output="none")[0]
    _expect_run(rows["device"], rows["backend"], ws, backend)
    big = rows["rows"]["all_reduce"][-1]
    return f"all_reduce {big.nbytes >> 20} MiB: {big.seconds * 1e3:.3f} ms"


def _ddp_script(ws: int, backend: str, timeout: float) -> str:
    from ..scripts.ddp_script import ScriptConfig, run

    res = launch.spawn(run, ScriptConfig(epochs=1, progress=False), world_size=ws,
                       backend=backend, timeout=timeout, output="none")
    r0 = res[0]
    _expect_run(r0["device"], r0["backend"], ws, backend)
    if r0["autocast"] != r0["device"].startswith("cuda"):  # 16-bit autocast on CUDA only
        raise AssertionError(f"autocast={r0['autocast']} trên {r0['device']}")
    return (f"{len(r0['losses'])} bước trên {r0['device']}, autocast {r0['amp_dtype'] or 'tắt'}, "
            f"giá trị mất mát cuối {vi.number(r0['losses'][-1], 4)}")


def _fsdp_script(ws: int, backend: str, timeout: float) -> str:
    from ..pages.fsdp_in_full import practice_tour

    with tempfile.TemporaryDirectory() as ckpt:
        res = launch.spawn(practice_tour, ckpt, world_size=ws, backend=backend,
                           timeout=timeout, output="none")
    return f"{len(res[0])} phần chạy xong: {', '.join(res[0])}"


def _torchrun(ws: int, backend: str, timeout: float) -> str:
    from .. import torchrun
    from ..scripts import torchrun_env

    results = torchrun.run("dpbook.scripts.torchrun_env", nproc_per_node=ws, timeout=timeout,
                           backend=backend)
    records = torchrun.json_records(results, torchrun_env.TAG)
    if len(records) != ws or {r["backend"] for r in records} != {_expected(ws, backend)}:
        raise AssertionError(f"{len(records)} worker, backend {[r['backend'] for r in records]}")
    for r in records:
        _expect_device(r["device"], r["backend"])
    total = vi.general(records[0]["allreduce_sum"])
    return f"{len(records)} worker dùng {records[0]['backend']}, AllReduce = {total}"


def _nccl_debug(ws: int, backend: str, timeout: float) -> str:
    import os

    from ..pages import failures

    with tempfile.TemporaryDirectory() as logs:
        with failures.env_vars(NCCL_DEBUG="INFO",
                               NCCL_DEBUG_FILE=os.path.join(logs, "nccl.%h.%p.log")):
            sums = launch.spawn(failures.all_reduce_once, world_size=ws, backend=backend,
                                timeout=timeout, output="none")
        lines = failures.read_logs(os.path.join(logs, "nccl.*.log"), max_lines=10_000)
    if sums != [ws * (ws + 1) / 2] * ws:
        raise AssertionError(f"AllReduce trả về {sums}")
    if _expected(ws, backend) == "nccl" and not any("NCCL INFO" in line for line in lines):
        raise AssertionError("NCCL_DEBUG=INFO không ghi dòng log nào")
    return f"AllReduce = {vi.general(sums[0])}, {len(lines)} dòng log NCCL"


def _errors(ws: int, backend: str, timeout: float) -> str:
    """4.2.5's two failures that behave differently under NCCL: a rank that crashes (the
    launcher names it, nobody hangs) and uneven inputs (the collective timeout ends the hang)."""
    from ..pages import failures

    if ws < 2:
        # both failures need a second rank: one that crashes, one whose peer waits (review D9)
        return "bỏ qua: cần từ 2 rank (một rank sập hay chờ thì phải có rank kia)"
    t0 = time.perf_counter()
    try:
        launch.spawn(failures.crash, world_size=ws, backend=backend, timeout=timeout,
                     output="none")
        raise AssertionError("failures.crash không báo lỗi")
    except launch.RankError as exc:
        if exc.rank != 1 or "mat1 and mat2" not in str(exc):
            raise AssertionError(f"crash: lỗi gốc sai: {str(exc).splitlines()[0]}") from exc
    crash_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batches = (3,) + (2,) * (ws - 1)
    try:
        launch.spawn(failures.uneven_inputs, batches=batches, collective_timeout=3.0,
                     world_size=ws, backend=backend, timeout=timeout, output="none")
        raise AssertionError("uneven_inputs không treo")
    except launch.RankError as exc:
        text = str(exc).lower()
        if exc.rank != 0 or not ("timeout" in text or "timed out" in text):
            raise AssertionError(f"uneven: {str(exc).splitlines()[0]}") from exc
    uneven_s = time.perf_counter() - t0
    return (f"crash báo rank 1 sau {vi.number(crash_s, 1)} s, số batch lệch dừng sau "
            f"{vi.number(uneven_s, 1)} s")


def _resume(ws: int, backend: str, timeout: float) -> str:
    import json
    import os

    from .. import torchrun

    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "final.pt")
        torchrun.run("dpbook.scripts.resume", ["--ckpt-dir", os.path.join(work, "ckpt"), "--out", out,
                                       "--steps", 8, "--ckpt-every", 4, "--kill-rank", ws - 1,
                                       "--kill-step", 6],
                     nproc_per_node=ws, max_restarts=1, timeout=timeout, backend=backend)
        with open(os.path.join(work, "final.json"), encoding="utf-8") as f:
            attempts = json.load(f)["attempts"]
    starts = [a["from_step"] for a in attempts]
    if starts != [0, 4]:
        raise AssertionError(f"các lần chạy bắt đầu từ bước {starts}, cần [0, 4]")
    return f"{len(attempts)} lần chạy, lần sau tiếp tục từ bước {starts[-1]}"


def _lab_a(ws: int, backend: str, timeout: float) -> str:
    from ..labs.lab_a import SOLUTION, checker
    from ..labs.lab_a.common import BATCH_SIZE

    if BATCH_SIZE % ws:
        return f"bỏ qua: BATCH_SIZE={BATCH_SIZE} không chia hết cho {ws} rank"
    result = checker.check(SOLUTION, nproc_per_node=ws, timeout=timeout, verbose=False,
                           backend=backend)
    if not result.passed:
        raise AssertionError(f"lời giải trượt các mục {result.failed}")
    return f"lời giải qua {len(result.items)} mục kiểm tra"


def _labs_bc(ws: int, backend: str, timeout: float) -> str:
    from ..labs import compare

    # Lab C's HYBRID_SHARD needs a 2 x (ws/2) mesh.
    configs = compare.LAB_B + compare.LAB_C if ws >= 4 and ws % 2 == 0 else compare.LAB_B
    results = launch.spawn(compare.measure_configs, configs, world_size=ws, backend=backend,
                           timeout=timeout, output="none")
    rows = compare.collect(results, configs)
    for row in rows:
        if abs(row.volume.total - row.predicted.volume.total) > 1e-6 * row.predicted.volume.total:
            raise AssertionError(f"{row.label}: đo {row.volume.total} B, công thức "
                                 f"{row.predicted.volume.total} B")
        if (row.peak_method == "cuda") != (_expected(ws, backend) == "nccl"):
            raise AssertionError(f"{row.label}: peak đo bằng {row.peak_method}")
    # Bài B's claim: with 2 ranks or more, every FSDP configuration peaks below DDP.
    ddp = next(r for r in rows if r.label == "DDP")
    higher = [r.label for r in rows if r is not ddp and ws >= 2 and r.peak >= ddp.peak]
    if higher:
        raise AssertionError(f"bộ nhớ đỉnh không thấp hơn DDP ({vi.grouped(ddp.peak)} B): {higher}")
    return (f"{len(rows)} cấu hình trên {ws} rank, giao tiếp = công thức, bộ nhớ đỉnh của mọi "
            f"cấu hình FSDP thấp hơn DDP ({vi.number(ddp.peak / 2**20, 2)} MiB)")


PAGES: dict[str, Callable[[int, str, float], str]] = {
    "4.2.1 giao tiếp": _primitives,
    "4.2.2 DDP đầy đủ": _ddp_script,
    "4.2.3 FSDP đầy đủ": _fsdp_script,
    "4.2.4 torchrun": _torchrun,
    "4.2.5 NCCL_DEBUG": _nccl_debug,
    "4.2.5 sập, lệch batch": _errors,
    "4.2.6 chịu lỗi": _resume,
    "Bài A": _lab_a,
    "Bài B, C": _labs_bc,
}


def run_pages(world: int, backend: str = "nccl", timeout: float = 300.0) -> list[dict]:
    """One row per page, each check on ``world`` ranks: ``{"page", "ok", "detail", "seconds"}``;
    a failure does not stop the rest. With ``backend="auto"`` every launcher chooses as it would
    for a learner (``launch.spawn``, torchrun's workers, lab A's script)."""
    rows = []
    for page, check in PAGES.items():
        t0 = time.perf_counter()
        try:
            detail, ok = check(world, backend, timeout), True
        except Exception as exc:  # report every page, whatever broke
            detail, ok = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", False
        rows.append({"page": page, "ok": ok, "detail": detail,
                     "seconds": time.perf_counter() - t0})
    return rows
