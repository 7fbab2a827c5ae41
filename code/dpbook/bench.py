"""A small all-reduce benchmark in the manner of nccl-tests: time, algbw, busbw per size.

``time_all_reduce`` is a rank function for ``launch.spawn``: on every rank it all-reduces
buffers of the given sizes, after a few warm-up calls, and keeps for each call the time of the
*slowest* rank (a collective is finished only when every rank has finished it). It returns the
median per size. ``BenchRow`` turns a median into the two bandwidths nccl-tests report, with
``costs.bus_bandwidth``:

* algbw = size / time;
* busbw = algbw * busbw_factor("all_reduce", N) = algbw * 2(N-1)/N.

``time_collectives`` does the same for AllGather and ReduceScatter too (busbw factor (N-1)/N;
as in nccl-tests and ``costs``, the size is that of the *full* tensor: the output of an
all-gather, the input of a reduce-scatter), and measures a plain tensor copy on the same device
as a reference: no transfer between ranks can beat the speed at which memory copies itself.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .checks import int_at_least, one_of
from .costs import bus_bandwidth, busbw_factor
from .launch import device
from .measure import sync

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


def all_gather_flat(output: torch.Tensor, shard: torch.Tensor, async_op: bool = False):
    """``all_gather_single`` (torch >= 2.13) or its older name ``all_gather_into_tensor``."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, shard, async_op=async_op)


def reduce_scatter_flat(output: torch.Tensor, full: torch.Tensor, async_op: bool = False):
    """``reduce_scatter_single`` (torch >= 2.13) or its older name ``reduce_scatter_tensor``."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, full, async_op=async_op)


def _check_sizes(sizes, itemsize: int, what: str = "một phần tử float32") -> tuple[int, ...]:
    sizes = tuple(sizes)
    if not sizes:
        raise ValueError("sizes phải có ít nhất một kích thước (byte).")
    for s in sizes:
        int_at_least("kích thước (byte)", s, itemsize)
        if s % itemsize:
            raise ValueError(f"kích thước {s} byte không chia hết cho {itemsize} byte của "
                             f"{what}.")
    return sizes


def _time_op(op, dev: torch.device, warmup: int, repeats: int) -> float:
    """Median over ``repeats`` calls of the slowest rank's time for the collective ``op()``."""
    for _ in range(warmup):
        op()
    sync(dev)
    times = torch.zeros(repeats, dtype=torch.float64, device=dev)
    for k in range(repeats):
        dist.barrier()  # start together, so no rank's time includes waiting for a late peer
        sync(dev)
        t0 = time.perf_counter()
        op()
        sync(dev)
        times[k] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return statistics.median(times.cpu().tolist())


def _time_one(t: torch.Tensor, warmup: int, repeats: int) -> float:
    """Median over ``repeats`` calls of the slowest rank's time for ``dist.all_reduce(t)``."""
    return _time_op(lambda: dist.all_reduce(t), t.device, warmup, repeats)


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


def round_sizes(sizes, world_size: int) -> tuple[int, ...]:
    """Each size rounded down to a multiple of ``4 * world_size`` bytes (equal float32 shards),
    duplicates and sizes that round to zero dropped."""
    int_at_least("world_size", world_size)
    unit = 4 * world_size
    return tuple(sorted({int(s) // unit * unit for s in sizes if int(s) >= unit}))


#: The collectives ``time_collectives`` can time.
TIMED = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class CopyRow:
    """Median time of one ``dst.copy_(src)`` of ``nbytes`` bytes on ``device``."""

    nbytes: int
    seconds: float
    device: str

    @property
    def bandwidth(self) -> float:
        """Bytes copied per second (each byte is read once and written once)."""
        return self.nbytes / self.seconds


def copy_bandwidth(nbytes: int, warmup: int = 2, repeats: int = 10,
                   dev: torch.device | None = None) -> CopyRow:
    """Median time of copying a float32 tensor of ``nbytes`` bytes into another on ``dev``."""
    int_at_least("nbytes", nbytes, 4)
    int_at_least("repeats", repeats)
    dev = torch.device("cpu") if dev is None else dev
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    times = []
    for k in range(warmup + repeats):
        sync(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(dev)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    if not torch.equal(dst, src):
        raise RuntimeError("bản sao khác bản gốc: phép đo memcpy không hợp lệ.")
    return CopyRow(src.numel() * src.element_size(), statistics.median(times), str(dev))


def _prepared(collective: str, nbytes: int, rank: int, world_size: int, dev: torch.device):
    """Buffers for one size, checked once against the definition; returns the op to time."""
    full, part = nbytes // 4, nbytes // 4 // world_size
    if collective == "all_reduce":
        t = torch.ones(full, device=dev)
        dist.all_reduce(t)
        ok = bool((t == world_size).all())
        t.zero_()  # sums of zeros stay zero however often we repeat
        return ok, lambda: dist.all_reduce(t)
    if collective == "all_gather":
        shard, out = torch.full((part,), float(rank), device=dev), torch.empty(full, device=dev)
        all_gather_flat(out, shard)
        ok = torch.equal(out, torch.arange(world_size, device=dev).repeat_interleave(part).float())
        return ok, lambda: all_gather_flat(out, shard)
    inp, out = torch.ones(full, device=dev), torch.empty(part, device=dev)
    reduce_scatter_flat(out, inp)
    ok = bool((out == world_size).all())
    return ok, lambda: reduce_scatter_flat(out, inp)


def time_collectives(rank: int, world_size: int, collectives=TIMED, sizes=DEFAULT_SIZES,
                     warmup: int = 3, repeats: int = 10) -> dict:
    """Rank function for ``launch.spawn``: median time per collective and size (float32).

    ``sizes`` are full-tensor bytes and must divide by ``4 * world_size`` (one equal float32
    shard per rank). Returns ``{"backend", "device", "itemsize", "rows": {name: [BenchRow]},
    "copy": CopyRow}``, the same on every rank; ``copy`` is timed on rank 0, at the largest size,
    while the other ranks wait.
    """
    collectives = tuple(collectives)
    for name in collectives:
        one_of("collective", name, TIMED)
    int_at_least("world_size", world_size)
    sizes = _check_sizes(sizes, 4 * world_size,
                         f"{world_size} shard float32 bằng nhau (mỗi rank một shard)")
    int_at_least("warmup", warmup, 0)
    int_at_least("repeats", repeats)
    dev = device()
    rows = {}
    for name in collectives:
        rows[name] = []
        for nbytes in sizes:
            ok, op = _prepared(name, nbytes, rank, world_size, dev)
            if not ok:
                raise RuntimeError(f"{name} {nbytes} byte cho kết quả sai khác định nghĩa.")
            rows[name].append(BenchRow(nbytes, _time_op(op, dev, warmup, repeats), world_size,
                                       name))
    # A copy takes far less time than a collective: more repeats cost little and steady it.
    copy = copy_bandwidth(max(sizes), max(2, warmup), max(20, repeats), dev) if rank == 0 else None
    box = [copy]
    dist.broadcast_object_list(box, src=0)
    return {"backend": dist.get_backend(), "device": str(dev), "itemsize": 4, "rows": rows,
            "copy": box[0]}
