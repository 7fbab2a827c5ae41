"""``make gpu-check``: run what learners run on this GPU machine and print what it saw.

1. The machine (``tools.machine.probe``, the probes ``python -m dpbook.doctor`` uses too): torch,
   CUDA, NCCL, the CUDA architectures the wheel was built for (a T4 needs ``sm_75``), each GPU's
   compute capability and native bf16, and which pairs of GPUs reach each other directly (P2P).
2. NCCL at every world size the machine allows (1, 2, 4, 8 and the GPU count): one DDP step and
   one FSDP2 step of a model big enough for CUDA's peak memory; the collectives ``CommLog`` saw
   (their ring-formula bytes) against ``labs.compare.predict``, FSDP2's peak below DDP's from 2
   ranks on, and NCCL's bus bandwidth timed as nccl-tests does (NCCL's bytes cannot be counted
   on a socket as gloo's are).
3. Part 4.2's pages (``dpbook.tools.gpu_pages``) under NCCL on the largest power of two of GPUs.
4. The fallbacks a learner's GPU box takes, each in a child process that sees fewer GPUs
   (``CUDA_VISIBLE_DEVICES``): 2 ranks with 1 GPU visible and 4 ranks with 2, where
   ``launch.spawn`` picks gloo and no rank may touch CUDA (``launch.NO_CUDA_VAR``).
5. Every notebook of the book under nbval, as ``make test`` runs them (``--no-notebooks`` skips).
6. With 2 GPUs or more, NCCL's flight recorder (section 4.2.7): a 2-rank job where rank 1 skips
   an AllReduce, with a short timeout and the recorder on (``pages.modern_ddp.nccl_hang``); the
   watchdog must write rank 0's dump, naming the AllReduce that did not complete.

7. ``python -m dpbook.memcheck`` under NCCL: DDP's bucket copy diagnosed, measured from
   ``torch.cuda`` statistics, and absent with ``gradient_as_bucket_view=True``.

It ends with a summary table in Markdown (check, result, detail; a failed notebook cell by its
notebook and cell) to paste into an issue, and exits 1 if any row failed.

On a machine without a GPU it says so and exits with status 0; where ``nvidia-smi`` lists GPUs
that this torch cannot use (a CPU build, or a CUDA build newer than the driver) it names the
driver, the wheel's CUDA and the build to install, and exits with status 1. ``--fallback N`` is
step 4's child: the page checks on N ranks with the backend ``launch.spawn`` picks; a child that
sees no GPU fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import launch, measure, vi
from ..labs import compare
from ..train import Parallel
from . import doctor, gpu_pages, machine

# Big enough that parameters dominate CUDA's peak memory, small enough for any GPU.
GPU_MODEL = {"in_dim": 1024, "hidden": 2048, "depth": 4, "out_dim": 1024}
# (GPUs visible, ranks): the fallbacks, where the ranks outnumber the GPUs.
FALLBACKS = ((1, 2), (2, 4))
FLIGHT_RECORDER_GPUS = 2  # the hang needs two ranks, each on its own GPU
HANG_TIMEOUT_S = 5.0  # the group's timeout in the hang: the watchdog fires after it
ROOT = Path(__file__).resolve().parents[2]


def world_sizes(gpus: int) -> list[int]:
    return sorted({w for w in (1, 2, 4, 8, gpus) if 1 <= w <= gpus})


def largest_power_of_two(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def environment(m: machine.Machine | None = None) -> list[str]:
    """What the wheel and the GPUs are (``machine.probe()`` unless ``m`` is given), in a few
    Vietnamese lines."""
    m = m or machine.probe()
    lines = [f"torch {m.torch_version}, CUDA {m.cuda_version}, NCCL {m.nccl or 'không có'}",
             f"kiến trúc CUDA trong bản torch này: {' '.join(m.arch_list)}"]
    for g in m.gpus:
        lines.append(f"  cuda:{g.index} {g.name}: {g.sm}"
                     f"{'' if g.built_for else ' (KHÔNG có trong bản torch này)'}, bf16 gốc: "
                     f"{'có' if g.native_bf16 else 'không (dùng fp16 + GradScaler)'}")
    n = m.gpu_count
    if n >= 2:
        rows = [" ".join("  -" if i == j else (" có" if m.p2p[i, j] else "  không")
                         for j in range(n)) for i in range(n)]
        lines.append("P2P (hàng: GPU nguồn, cột: GPU đích): " + " | ".join(rows))
    return lines


def run(timeout: float = 240.0) -> list[dict]:
    gpus = torch.cuda.device_count()
    rows = []
    for ws in world_sizes(gpus):
        for par in (Parallel("ddp"), Parallel("fsdp2")):
            t0 = time.perf_counter()
            reports = launch.spawn(measure.measure_step, par, model_kwargs=GPU_MODEL,
                                   batch_size=32, world_size=ws, backend="nccl",
                                   timeout=timeout, output="rank0")
            r0 = reports[0]
            rows.append({
                "world_size": ws,
                "method": par.label,
                "peak_mib": max(r["peak"].peak for r in reports) / 2**20,
                "step_ms": 1e3 * statistics.median(r0["step_times"]),
                "comm_mib": r0["volume"].total / 2**20,
                "predicted_mib": compare.predict(par, r0["num_params"], ws,
                                                 r0["root_params"]).volume.total / 2**20,
                "launch_s": time.perf_counter() - t0,
            })
    return rows


def peak_problems(rows: list[dict]) -> list[str]:
    """Where FSDP2 does not peak below DDP at the same world size (2 ranks or more)."""
    by = {(r["world_size"], r["method"].split()[0]): r["peak_mib"] for r in rows}
    return [f"N = {ws}: FSDP2 {vi.number(by[ws, 'FSDP2'], 1)} MiB ≥ DDP "
            f"{vi.number(by[ws, 'DDP'], 1)} MiB"
            for ws, m in by if m == "DDP" and ws >= 2 and (ws, "FSDP2") in by
            and by[ws, "FSDP2"] >= by[ws, "DDP"]]


def print_pages(rows: list[dict]) -> bool:
    for row in rows:
        seconds = vi.number(row["seconds"], 1)
        print(f"  {'✓' if row['ok'] else '✗'} {row['page']:<22} {seconds:>6} s  "
              f"{row['detail']}")
    return all(r["ok"] for r in rows)


def visible_devices(visible: int, environ=None) -> str:
    """The first ``visible`` of the GPUs this process may use: a slice of an existing
    ``CUDA_VISIBLE_DEVICES`` (SLURM, a shared node), else of 0, 1, ..."""
    environ = os.environ if environ is None else environ
    given = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return ",".join(given[:visible] if given else map(str, range(visible)))


def fallback(visible: int, ranks: int, timeout: float = 600.0) -> bool:
    """Step 4: ``--fallback ranks`` in a child that sees the first ``visible`` GPUs."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible_devices(visible),
           launch.NO_CUDA_VAR: "1"}
    print(f"\nDự phòng: {ranks} rank, {visible} GPU nhìn thấy (CUDA_VISIBLE_DEVICES="
          f"{env['CUDA_VISIBLE_DEVICES']}):", flush=True)
    proc = subprocess.run([sys.executable, "-m", "dpbook.tools.gpu_check", "--fallback", str(ranks)],
                          env=env, timeout=timeout, text=True, capture_output=True)
    print(proc.stdout + proc.stderr[-3000:], end="", flush=True)
    return proc.returncode == 0


def flight_recorder(timeout: float = 180.0, hang_timeout: float = HANG_TIMEOUT_S) -> bool:
    """Step 6: ``modern_ddp.nccl_hang`` on 2 GPUs under NCCL. The job must fail (rank 0's
    watchdog ends it) and leave ``<prefix>0``, a dump with the AllReduce that never completed."""
    from ..pages import modern_ddp
    from ..pages.failures import env_vars

    folder = tempfile.mkdtemp(prefix="dpbook-flight-recorder-")
    prefix = os.path.join(folder, "nccl_trace_rank_")
    print(f"\nFlight recorder của NCCL: 2 rank, rank 1 bỏ một AllReduce, timeout "
          f"{vi.general(hang_timeout)} s (dump: {prefix}<rank>):", flush=True)
    try:
        # in the ranks' environment before their first NCCL group exists, as an `export` would be
        with env_vars(**modern_ddp.flight_recorder_env(prefix)):
            launch.spawn(modern_ddp.nccl_hang, prefix, hang_timeout,
                         world_size=FLIGHT_RECORDER_GPUS, backend="nccl", timeout=timeout,
                         output="none")
        problem = "job không treo: mọi rank đều xong, không có timeout nào"
    except (launch.RankError, TimeoutError):
        problem = modern_ddp.check_dump(prefix + "0")
    ok = problem is None
    print(f"  {'✓' if ok else '✗'} {modern_ddp.describe_dump(prefix + '0') if ok else problem}",
          flush=True)
    return ok


def notebooks(jobs: int) -> list[tuple[str, bool, str]]:
    """Step 5: nbval over every notebook, as ``make test`` runs them; one summary row, and one
    row per failed cell (the notebook and the cell, from pytest's JUnit report)."""
    import xml.etree.ElementTree as ET

    print(f"\nMọi notebook của sách dưới nbval ({jobs} worker):", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "nbval.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", str(jobs), "--dist", "loadfile",
               "--nbval-lax", "-p", "no:cacheprovider", f"--junitxml={report}", "book"]
        code = subprocess.run(cmd, cwd=ROOT).returncode
        cases = ET.parse(report).getroot().iter("testcase") if report.exists() else []
        failed, passed = [], 0
        for case in cases:
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is None:
                passed += case.find("skipped") is None
                continue
            where = f"{case.get('classname', '')}::{case.get('name', '')}"
            failed.append((f"nbval {where}", False,
                           (bad.get("message") or "").splitlines()[0][:150] if bad.get("message")
                           else "trượt"))
    head = ("nbval, mọi notebook", code == 0 and not failed,
            f"{passed} ô đạt, {len(failed)} ô trượt" + ("" if code == 0 else f" (pytest: mã {code})"))
    return [head, *failed]


def bus_bandwidth(ws: int, timeout: float = 240.0) -> tuple[bool, str]:
    """NCCL's bytes cannot be counted on a socket: timed instead, as nccl-tests does (the
    bus bandwidth of an AllReduce of 256 MB, ``bench.time_all_reduce``)."""
    from .. import bench

    out = launch.spawn(bench.time_all_reduce, sizes=(256 * 10**6,), world_size=ws,
                       backend="nccl", timeout=timeout, output="rank0")
    row = out[0]["rows"][0]
    return row.busbw > 0, (f"AllReduce 256 MB trên {ws} GPU: {vi.number(row.seconds * 1e3, 2)} ms,"
                           f" busbw {vi.number(row.busbw / 1e9, 1)} GB/s (đo bằng thời gian)")


def memcheck_rows(gpus: int) -> list[tuple[str, bool, str]]:
    """Issue 30's command under NCCL (``torch.cuda`` statistics): the default DDP must be told
    its bucket copy (``bucket_copy``), ``ddp-view`` must not, and on every rank the measured
    parameters, gradients, optimizer state and buffers must equal the ledger's."""
    from .. import memcheck

    rows = []
    ws = min(2, gpus)
    for strategy, expect in (("ddp", True), ("ddp-view", False)):
        name = f"memcheck --strategy {strategy}, {ws} GPU"
        try:
            report = memcheck.run("dpbook.memcheck.examples:book_mlp", strategy, nproc=ws)
        except Exception as exc:  # report it in the table, go on with the rest
            rows.append((name, False, f"{type(exc).__name__}: {exc}"[:150]))
            continue
        codes = [d["code"] for d in report.diagnoses]
        keys = ("parameters", "gradients", "optimizer", "buffers")
        off = [f"rank {r['rank']} {k}" for r in report.ranks for k in keys
               if r["predicted"].get(k) != r["measured"].get(k)]
        ok = (("bucket_copy" in codes) == expect) and not off
        rows.append((name, ok, f"chẩn đoán {codes or 'không có'}"
                     + (f"; lệch sổ kế toán: {', '.join(off)}" if off else "")))
    return rows


def markdown(summary: list[tuple[str, bool, str]]) -> str:
    """The summary as a Markdown table, to paste into an issue."""
    lines = ["| kiểm tra | kết quả | chi tiết |", "| --- | --- | --- |"]
    lines += [f"| {name} | {'đạt' if ok else '**TRƯỢT**'} | {detail.replace('|', '/')} |"
              for name, ok, detail in summary]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpbook.tools.gpu_check")
    parser.add_argument("--fallback", type=int, metavar="N",
                        help="chỉ chạy các trang trên N rank với backend launch.spawn tự chọn")
    parser.add_argument("--no-notebooks", action="store_true", help="bỏ bước chạy mọi notebook")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        if args.fallback is not None:
            # a fallback child must see the GPUs its parent gave it, or it checked nothing
            print(f"  ✗ process con không thấy GPU nào (CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}): không kiểm tra được dự phòng.")
            return 1
        advice = doctor.unusable_gpus_advice(machine.probe())
        if advice:
            print(f"LỖI: {advice}")
            return 1
        print("Không tìm thấy GPU nào (torch.cuda.is_available() là False, nvidia-smi không thấy "
              "GPU): bỏ qua kiểm tra GPU. Hãy chạy `make gpu-check` trên máy có GPU NVIDIA.")
        return 0
    if args.fallback is not None:
        print("  " + launch.describe_mode(args.fallback))
        return 0 if print_pages(gpu_pages.run_pages(args.fallback, backend="auto")) else 1
    gpus = torch.cuda.device_count()
    print("\n".join(environment()))
    print(launch.describe_mode(gpus))
    summary: list[tuple[str, bool, str]] = []
    rows = run()
    header = (f"{'N':>3} {'cách chia':<42} {'đỉnh MiB':>9} {'bước ms':>8} "
              f"{'CommLog MiB':>11} {'công thức MiB':>13}")
    print(header)
    print("-" * len(header))
    for r in rows:
        # CommLog's bytes are the ring formula applied to the collectives it saw; equality says
        # the step ran the collectives, sizes and passes the formula expects, not a byte count.
        match = abs(r["comm_mib"] - r["predicted_mib"]) <= 1e-9 + 1e-6 * r["predicted_mib"]
        cols = (vi.number(r["peak_mib"], 1), vi.number(r["step_ms"], 2),
                vi.number(r["comm_mib"], 2), vi.number(r["predicted_mib"], 2))
        print(f"{r['world_size']:>3} {r['method']:<42} {cols[0]:>9} {cols[1]:>8} "
              f"{cols[2]:>11} {cols[3]:>13}{'' if match else '  ≠'}")
        summary.append((f"N = {r['world_size']}, {r['method']}: phép tập thể như công thức",
                        match, f"đỉnh {cols[0]} MiB, bước {cols[1]} ms"))
    problems = peak_problems(rows)
    summary.append(("Bộ nhớ đỉnh FSDP2 < DDP ở mọi N ≥ 2", not problems, "; ".join(problems)))
    for ws in world_sizes(gpus):
        if ws >= 2:
            try:
                summary.append((f"Băng thông bus, {ws} GPU", *bus_bandwidth(ws)))
            except Exception as exc:  # report it in the table, go on with the rest
                summary.append((f"Băng thông bus, {ws} GPU", False, f"{type(exc).__name__}: {exc}"[:150]))
            print(f"  {summary[-1][2]}", flush=True)
    world = largest_power_of_two(gpus)
    print(f"\nĐường chạy của các trang phần 4.2, NCCL, {world} rank:")
    pages = gpu_pages.run_pages(world, backend="nccl")
    print_pages(pages)
    summary += [(f"Trang {p['page']} (NCCL, {world} rank)", p["ok"], p["detail"]) for p in pages]
    for visible, ranks in FALLBACKS:
        if visible <= gpus:
            summary.append((f"Dự phòng: {ranks} rank, {visible} GPU", fallback(visible, ranks), ""))
    if gpus >= FLIGHT_RECORDER_GPUS:
        summary.append(("Flight recorder của NCCL", flight_recorder(), ""))
    summary += memcheck_rows(gpus)
    if not args.no_notebooks:
        summary += notebooks(args.jobs)
    ok = all(row[1] for row in summary)
    print("\nTóm tắt (dán được vào một issue):\n")
    print(markdown(summary))
    print("\nKết quả: " + ("mọi kiểm tra đều đạt." if ok else "CÓ KIỂM TRA TRƯỢT (xem bảng)."))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
