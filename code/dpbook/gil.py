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
when the cores are free. Whether they were free is measured too (Linux), from the machine's
idle time: ``spare_cores`` is how many cores sat idle, on average, while the serial runs kept one
busy, and a round is *quiet* when other programs took less than ``QUIET_LOAD`` of a core both
while the serial runs and while the processes ran. ``quiet_speedup`` is the processes' speed-up
over serial in the best quiet round, with both times from that round: the claim "processes run
in parallel" is only checked where nothing else took the cores (on a machine that other
programs saturate, no program can run faster in parallel).

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

from . import vi
from .checks import int_at_least

QUIET_LOAD = 0.3  # cores that other programs may take during a round that still counts as quiet


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
    quiet_rounds: int = 0
    quiet_speedup: float | None = None  # serial / processes in the best quiet round

    @property
    def threads_speedup(self) -> float:
        return self.serial_s / self.threads_s

    @property
    def processes_speedup(self) -> float:
        return self.serial_s / self.processes_s

    def describe(self) -> str:
        n = self.workers

        def ms(seconds: float) -> str:
            return f"{vi.number(seconds * 1e3, 1):>6} ms"

        return (f"{n} tác vụ Python thuần trên máy {self.cores} lõi, thời gian tốt nhất của "
                f"{self.rounds} lượt:\n"
                f"  tuần tự   : {ms(self.serial_s)}\n"
                f"  {n} luồng   : {ms(self.threads_s)}  → nhanh "
                f"{vi.number(self.threads_speedup, 2)}×, bận tối đa "
                f"{vi.number(self.threads_cores, 2)} lõi\n"
                f"  {n} process : {ms(self.processes_s)}  → nhanh "
                f"{vi.number(self.processes_speedup, 2)}×, bận tối đa "
                f"{vi.number(self.processes_cores, 2)} lõi\n"
                + ("  (không đo được số lõi rảnh trên hệ điều hành này)" if self.spare_cores is None
                   else "  lõi rảnh trung bình khi chạy tuần tự: "
                        f"{vi.number(self.spare_cores, 2)}; {self.quiet_rounds}/{self.rounds} lượt "
                        "không bị chương trình khác chiếm lõi"
                        + ("" if self.quiet_speedup is None else
                           f", process nhanh {vi.number(self.quiet_speedup, 2)}× trong lượt tốt "
                           "nhất của chúng")))


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


def _others(cores: int, wall: float, ours: float, idle0, idle1) -> float | None:
    """Cores that other programs took during ``wall`` seconds in which this job used ``ours``
    CPU seconds: what was neither idle nor ours."""
    if idle0 is None or idle1 is None:
        return None
    return max(0.0, cores - (idle1 - idle0 + ours) / wall)


def _round(pool, workers: int, work: int, cores: int) -> tuple:
    """One round: (serial s, threads s, processes s, threads' cores, processes' cores,
    idle core-seconds of the machine during the serial runs or None, quiet or None)."""
    i0, t0, c0 = idle_seconds(), time.perf_counter(), time.process_time()
    for _ in range(workers):
        spin(work)
    t1, c1, i1 = time.perf_counter(), time.process_time(), idle_seconds()
    _in_threads(workers, work)
    t2, c2, i2 = time.perf_counter(), time.process_time(), idle_seconds()
    child_cpu = pool.map(spin_cpu, [work] * workers, chunksize=1)
    t3, i3 = time.perf_counter(), idle_seconds()
    idle = None if i0 is None or i1 is None else i1 - i0
    loads = (_others(cores, t1 - t0, c1 - c0, i0, i1),
             _others(cores, t3 - t2, sum(child_cpu) + time.process_time() - c2, i2, i3))
    quiet = None if None in loads else max(loads) < QUIET_LOAD
    return (t1 - t0, t2 - t1, t3 - t2, (c2 - c1) / (t2 - t1), sum(child_cpu) / (t3 - t2), idle,
            quiet)


def gil_speedup(workers: int = 2, work: int = 500_000, rounds: int = 10) -> GilSpeedup:
    """Time ``workers`` tasks of ``spin(work)``: serially, in threads, in processes."""
    int_at_least("workers", workers)
    int_at_least("work", work)
    int_at_least("rounds", rounds)
    cores = available_cores()
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(spin, [1000] * workers, chunksize=1)  # every child started and warm
        runs = [_round(pool, workers, work, cores) for _ in range(rounds)]
    serial, threads, procs, t_cores, p_cores, idle, quiet = zip(*runs)
    spare = None if None in idle else sum(idle) / sum(serial)
    calm = [r[0] / r[2] for r in runs if r[6]]
    return GilSpeedup(workers, cores, rounds, min(serial), min(threads), min(procs),
                      max(t_cores), max(p_cores), spare, len(calm), max(calm, default=None))
