"""A small all-reduce benchmark in the manner of nccl-tests: time, algbw, busbw per size.

``time_all_reduce`` is a rank function for ``launch.spawn``: on every rank it all-reduces
buffers of the given sizes, after a few warm-up calls, and keeps for each call the time of the
*slowest* rank (a collective is finished only when every rank has finished it). It returns the
median per size. ``BenchRow`` turns a median into the two bandwidths nccl-tests report, with
``costs.bus_bandwidth``:

* algbw = size / time;
* busbw = algbw * busbw_factor("all_reduce", N) = algbw * 2(N-1)/N.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .checks import int_at_least
from .costs import bus_bandwidth, busbw_factor
from .launch import device

#: Sizes in bytes (1 kB ... 10 MB, decimal units as in the rest of the book).
DEFAULT_SIZES = (10**3, 10**4, 10**5, 10**6, 10**7)


@dataclass(frozen=True)
class BenchRow:
    """One size: the median time of an all-reduce of ``nbytes`` bytes on ``world_size`` ranks."""

    nbytes: int
    seconds: float
    world_size: int
    collective: str = "all_reduce"

    @property
    def algbw(self) -> float:
        """Algorithm bandwidth in bytes/s: ``nbytes / seconds``."""
        return bus_bandwidth(self.collective, self.nbytes, self.seconds, self.world_size)[0]

    @property
    def busbw(self) -> float:
        """Bus bandwidth in bytes/s: ``algbw * busbw_factor(collective, world_size)``."""
        return bus_bandwidth(self.collective, self.nbytes, self.seconds, self.world_size)[1]

    @property
    def factor(self) -> float:
        return busbw_factor(self.collective, self.world_size)


def _check_sizes(sizes, itemsize: int) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if not sizes:
        raise ValueError("sizes phải có ít nhất một kích thước (byte).")
    for s in sizes:
        int_at_least("kích thước (byte)", s, itemsize)
        if s % itemsize:
            raise ValueError(f"kích thước {s} byte không chia hết cho {itemsize} byte của "
                             "một phần tử float32.")
    return sizes


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time_one(t: torch.Tensor, warmup: int, repeats: int) -> float:
    """Median over ``repeats`` calls of the slowest rank's time for ``dist.all_reduce(t)``."""
    dev = t.device
    for _ in range(warmup):
        dist.all_reduce(t)
    _sync(dev)
    times = torch.zeros(repeats, dtype=torch.float64, device=dev)
    for k in range(repeats):
        dist.barrier()  # start together, so no rank's time includes waiting for a late peer
        _sync(dev)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        _sync(dev)
        times[k] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return statistics.median(times.cpu().tolist())


def time_all_reduce(rank: int, world_size: int, sizes=DEFAULT_SIZES, warmup: int = 3,
                    repeats: int = 10) -> dict:
    """Rank function for ``launch.spawn``: median ``dist.all_reduce`` time per size (float32).

    Before timing, one all-reduce of ones checks the result (every element must equal N).
    Returns ``{"backend", "device", "rows": [BenchRow, ...]}``, the same on every rank.
    """
    sizes = _check_sizes(sizes, 4)
    int_at_least("warmup", warmup, 0)
    int_at_least("repeats", repeats)
    dev = device()
    rows = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        dist.all_reduce(t)
        if not bool((t == world_size).all()):
            raise RuntimeError(f"AllReduce {nbytes} byte cho kết quả sai: cần mọi phần "
                               f"tử bằng {world_size}.")
        t.zero_()  # sums of zeros stay zero however often we repeat
        rows.append(BenchRow(nbytes, _time_one(t, warmup, repeats), world_size))
    return {"backend": dist.get_backend(), "device": str(dev), "rows": rows}


def fit_alpha_beta(rows: list[BenchRow]) -> tuple[float, float]:
    """Rough ``(alpha, beta)`` of the ring model from a benchmark.

    No all-reduce is faster than its latency, so the fastest measured time is taken as pure
    latency, ``t = 2(N-1) alpha`` (it is normally that of a small message). The largest message
    is taken as pure bandwidth, where ``t = 2(N-1)/N * S / beta``, i.e. ``beta = busbw``.
    """
    if not rows:
        raise ValueError("cần ít nhất một dòng kết quả đo.")
    if len({r.world_size for r in rows}) != 1:
        raise ValueError("mọi dòng phải đo với cùng một world_size.")
    int_at_least("world_size", rows[0].world_size, 2)
    fastest = min(rows, key=lambda r: r.seconds)
    large = max(rows, key=lambda r: r.nbytes)
    return fastest.seconds / (2 * (fastest.world_size - 1)), large.busbw
