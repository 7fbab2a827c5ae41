"""The GIL, measured: N threads against N processes on the same pure-Python work.

``gil_speedup(workers)`` times ``workers`` equal tasks of pure-Python arithmetic run three ways:
one after the other (serial), in ``workers`` threads of this process, and in ``workers``
processes of a pool started beforehand (so that process start-up is not timed). The three are
timed back to back in each of ``rounds`` rounds, and each keeps its best (smallest) time, as
``timeit`` does: other programs on the machine can only make a run slower, never faster, so the
best time is the one least disturbed by them. The speed-ups are ratios of best times.

It also counts CPU time: how many cores the threads (or the processes) kept busy on average
while they ran, CPU seconds over wall seconds. Under CPython's GIL only one thread runs Python
bytecode at a time, so the threads never keep more than about one core busy, however many
cores are free, and the speed-up is about 1x; processes reach about ``min(workers, cores)``x
when the cores are free. Whether they were free is measured too (Linux): ``spare_cores`` is how
many cores sat idle, on average, while the serial runs kept one busy. On a machine that other
programs saturate it is near 0, and no program can then run faster in parallel.

This module imports no torch, so that the pool's children (start method ``spawn``) start in a
fraction of a second.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from dataclasses import dataclass

from .checks import int_at_least


def spin(n: int) -> int:
    """Pure-Python work that holds the GIL all along: ``n`` multiply-add-modulo steps."""
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def spin_cpu(n: int) -> float:
    """``spin(n)``, returning the CPU seconds this process spent on it."""
    t0 = time.process_time()
    spin(n)
    return time.process_time() - t0


def _cgroup_cpu_limit() -> float | None:
    """The CPU quota of this container in cores (cgroup v2 ``cpu.max`` or v1 CFS), if any."""
    for path, parse in (("/sys/fs/cgroup/cpu.max", lambda t: t.split()),
                        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None)):
        try:
            with open(path) as f:
                text = f.read()
            if parse:
                quota, period = parse(text)
            else:
                with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                    quota, period = text.strip(), f.read().strip()
            if quota not in ("max", "-1"):
                return int(quota) / int(period)
        except (OSError, ValueError):
            continue
    return None


def available_cores() -> int:
    """CPU cores this process may use: its affinity mask where the OS has one, capped by a
    container's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    return max(1, min(cores, int(limit))) if limit else cores


@dataclass(frozen=True)
class GilSpeedup:
    """Best wall times (s) of ``workers`` tasks run three ways, the speed-ups over serial, and
    the most cores the threads / the processes kept busy in any round (CPU s / wall s)."""

    workers: int
    cores: int
    rounds: int
    serial_s: float
    threads_s: float
    processes_s: float
    threads_cores: float
    processes_cores: float
    spare_cores: float | None  # idle cores during the serial runs; None where unmeasurable

    @property
    def threads_speedup(self) -> float:
        return self.serial_s / self.threads_s

    @property
    def processes_speedup(self) -> float:
        return self.serial_s / self.processes_s

    def describe(self) -> str:
        n = self.workers
        return (f"{n} tác vụ Python thuần trên máy {self.cores} lõi, thời gian tốt nhất của "
                f"{self.rounds} lượt:\n"
                f"  tuần tự   : {self.serial_s * 1e3:6.1f} ms\n"
                f"  {n} luồng   : {self.threads_s * 1e3:6.1f} ms  → nhanh "
                f"{self.threads_speedup:.2f}×, bận tối đa {self.threads_cores:.2f} lõi\n"
                f"  {n} process : {self.processes_s * 1e3:6.1f} ms  → nhanh "
                f"{self.processes_speedup:.2f}×, bận tối đa {self.processes_cores:.2f} lõi\n"
                + ("  (không đo được số lõi rảnh trên hệ điều hành này)" if self.spare_cores is None
                   else f"  lõi rảnh trung bình khi chạy tuần tự: {self.spare_cores:.2f}"))


def _in_threads(workers: int, work: int) -> None:
    threads = [threading.Thread(target=spin, args=(work,)) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def idle_seconds() -> float | None:
    """Idle CPU seconds of the whole machine since boot, summed over cores (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        return (int(fields[3]) + int(fields[4])) / os.sysconf("SC_CLK_TCK")  # idle + iowait
    except (OSError, ValueError, IndexError):
        return None


def _round(pool, workers: int, work: int) -> tuple:
    """One round: (serial s, threads s, processes s, threads' cores, processes' cores,
    idle core-seconds of the machine during the serial runs or None)."""
    i0, t0 = idle_seconds(), time.perf_counter()
    for _ in range(workers):
        spin(work)
    t1, c1, i1 = time.perf_counter(), time.process_time(), idle_seconds()
    _in_threads(workers, work)
    t2, c2 = time.perf_counter(), time.process_time()
    child_cpu = pool.map(spin_cpu, [work] * workers, chunksize=1)
    t3 = time.perf_counter()
    idle = None if i0 is None or i1 is None else i1 - i0
    return t1 - t0, t2 - t1, t3 - t2, (c2 - c1) / (t2 - t1), sum(child_cpu) / (t3 - t2), idle


def gil_speedup(workers: int = 2, work: int = 500_000, rounds: int = 10) -> GilSpeedup:
    """Time ``workers`` tasks of ``spin(work)``: serially, in threads, in processes."""
    int_at_least("workers", workers)
    int_at_least("work", work)
    int_at_least("rounds", rounds)
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(spin, [1000] * workers, chunksize=1)  # every child started and warm
        runs = [_round(pool, workers, work) for _ in range(rounds)]
    serial, threads, procs, t_cores, p_cores, idle = zip(*runs)
    spare = None if None in idle else sum(idle) / sum(serial)
    return GilSpeedup(workers, available_cores(), rounds, min(serial), min(threads), min(procs),
                      max(t_cores), max(p_cores), spare)
