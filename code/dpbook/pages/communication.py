"""The communication primitives of ``torch.distributed``, run for real on small readable tensors.

Every function here is a rank function for ``launch.spawn``: the default process group already
exists when it starts. Rank ``r`` holds ``rank_tensor(r, numel) = [10r+1, 10r+2, ...]``, so
each printed number says which rank and which position it came from. Functions return plain
Python values (lists, floats) so that results pickle cheaply and print as tables.

``primitives_tour`` runs everything in one launch (starting processes costs seconds):
who-am-I, the collectives, a send/recv ring, a barrier, an asynchronous all-reduce, and the
three ``init_method`` forms of ``init_process_group`` (``file://``, ``tcp://``, ``env://``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from ..bench import all_gather_flat, reduce_scatter_flat
from ..checks import int_at_least, non_negative
from ..launch import device
from ..measure import sync
from ..torchrun import free_port

#: The operations ``run_collectives`` shows, in the order the page explains them.
COLLECTIVE_NAMES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
INIT_METHODS = ("file", "tcp", "env")


def rank_tensor(rank: int, numel: int, dev: torch.device | None = None) -> torch.Tensor:
    """``[10*rank + 1, ..., 10*rank + numel]`` in float32: the tens digit names the rank."""
    int_at_least("rank", rank, 0)
    int_at_least("numel", numel)
    return torch.arange(1, numel + 1, dtype=torch.float32, device=dev) + 10 * rank


def whoami(rank: int, world_size: int) -> dict:
    """What a rank knows about itself: ``dist`` calls, the environment variables, its device."""
    return {
        "rank": dist.get_rank(), "world_size": dist.get_world_size(),
        "backend": dist.get_backend(), "device": str(device()), "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
    }


def _listed(t: torch.Tensor) -> list[float]:
    return t.cpu().tolist()


def run_collectives(rank: int, world_size: int, numel: int | None = None) -> dict:
    """Run each collective of ``COLLECTIVE_NAMES`` on a fresh ``rank_tensor``.

    Returns ``{name: {"before": [...], "after": [...] or None}}``; ``after`` is ``None`` where
    PyTorch leaves the buffer unspecified (``reduce`` on ranks other than ``dst``).
    ``numel`` defaults to ``2 * world_size`` and must divide by ``world_size`` (reduce_scatter).
    """
    numel = 2 * world_size if numel is None else numel
    int_at_least("numel", numel)
    if numel % world_size:
        raise ValueError(f"numel={numel} phải chia hết cho world_size={world_size} để "
                         "reduce_scatter chia đều cho mỗi rank.")
    dev = device()
    out = {}

    def record(name, before, after):
        out[name] = {"before": before, "after": None if after is None else _listed(after)}

    x = rank_tensor(rank, numel, dev)
    before = _listed(x)
    dist.broadcast(x, src=0)  # in place: every rank ends with rank 0's tensor
    record("broadcast", before, x)

    x = rank_tensor(rank, numel, dev)
    dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)  # only dst's buffer is defined afterwards
    record("reduce", before, x if rank == 0 else None)

    x = rank_tensor(rank, numel, dev)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)  # in place, the sum on every rank
    record("all_reduce", before, x)

    x = rank_tensor(rank, numel, dev)
    gathered = torch.empty(world_size * numel, device=dev)  # the shards, in rank order
    all_gather_flat(gathered, x)
    record("all_gather", before, gathered)

    x = rank_tensor(rank, numel, dev)
    shard = torch.empty(numel // world_size, device=dev)  # chunk ``rank`` of the sum
    reduce_scatter_flat(shard, x)
    record("reduce_scatter", before, shard)
    return out


def ring_pass(rank: int, world_size: int, numel: int = 3) -> dict:
    """Point to point: each rank sends its tensor to ``rank+1`` and receives from ``rank-1``.

    A blocking ``send`` may wait until the peer posts its ``recv``; if every rank sent first,
    all could wait forever. Even ranks therefore send then receive, odd ranks the reverse.
    """
    int_at_least("world_size", world_size, 2)
    dev = device()
    mine = rank_tensor(rank, numel, dev)
    got = torch.empty(numel, device=dev)
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    if rank % 2 == 0:
        dist.send(mine, dst=nxt)
        dist.recv(got, src=prev)
    else:
        dist.recv(got, src=prev)
        dist.send(mine, dst=nxt)
    return {"sent": _listed(mine), "to": nxt, "received": _listed(got), "from": prev}


def barrier_wait(rank: int, world_size: int, late_rank: int = 1, delay: float = 0.3) -> dict:
    """``late_rank`` arrives ``delay`` seconds late at a barrier; everyone reports its wait."""
    int_at_least("late_rank", late_rank, 0)
    non_negative("delay", delay)
    dist.barrier()  # line up first, so the waits below measure only the delay
    if rank == late_rank:
        time.sleep(delay)
    t0 = time.perf_counter()
    dist.barrier()
    return {"late": rank == late_rank, "waited": time.perf_counter() - t0}


def average(rank: int, world_size: int) -> dict:
    """All-reduce ``[rank + 1, 10 (rank + 1)]`` with ``ReduceOp.AVG``, and again with ``SUM``
    then a division by ``world_size``: both backends accept ``AVG`` (gloo sums, then divides,
    in PyTorch's own wrapper)."""
    dev = device()
    x = torch.tensor([rank + 1.0, 10.0 * (rank + 1)], device=dev)
    avg, total = x.clone(), x.clone()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    dist.all_reduce(total)
    return {"avg": _listed(avg), "sum_then_divide": _listed(total / world_size)}


def _compute(a: torch.Tensor, repeats: int) -> None:
    for _ in range(repeats):
        a = torch.tanh(a @ a) * 0.5  # work that needs no communication
    sync(a.device)


def async_overlap(rank: int, world_size: int, numel: int = 2_000_000, matmul: int = 256,
                  repeats: int = 20) -> dict:
    """Time an all-reduce alone, some compute alone, then both with ``async_op=True``.

    ``launch``: how long ``dist.all_reduce(..., async_op=True)`` takes to return a ``Work``
    handle; ``done_at_launch``: ``work.is_completed()`` right after; ``correct``: the result
    after ``work.wait()`` equals the sum over ranks.
    """
    int_at_least("numel", numel)
    dev = device()
    buf = torch.ones(numel, device=dev)
    a = torch.randn(matmul, matmul, device=dev) / matmul**0.5
    dist.all_reduce(buf), _compute(a, 1)  # warm-up: connections, allocator, kernels
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    sync(dev)
    t_comm = time.perf_counter() - t0
    t0 = time.perf_counter()
    _compute(a, repeats)
    t_compute = time.perf_counter() - t0
    buf.fill_(float(rank + 1))
    dist.barrier()
    t0 = time.perf_counter()
    work = dist.all_reduce(buf, async_op=True)  # returns at once; the transfer goes on
    t_launch = time.perf_counter() - t0
    done_at_launch = work.is_completed()
    _compute(a, repeats)  # runs while the all-reduce is in flight
    work.wait()  # from here on buf holds the sum (on GPU: for work queued after this point)
    sync(dev)
    t_both = time.perf_counter() - t0
    expected = world_size * (world_size + 1) / 2
    return {"comm": t_comm, "compute": t_compute, "both": t_both, "launch": t_launch,
            "done_at_launch": done_at_launch, "nbytes": buf.numel() * buf.element_size(),
            "correct": bool((buf == expected).all()),
            "returned_before_done": _returns_before_done(rank, dev)}


def _returns_before_done(rank: int, dev) -> bool | None:
    """Without a clock: rank 0 launches an asynchronous AllReduce while the other ranks wait for
    its word through the store, so the collective cannot have finished when the call returns;
    rank 0 reports ``not work.is_completed()`` (the others ``None``)."""
    store = dist.distributed_c10d._get_default_store()
    probe = torch.ones(4, device=dev)
    result = None
    if rank == 0:
        work = dist.all_reduce(probe, async_op=True)
        result = not work.is_completed()
        store.set("dpbook_async_probe", "1")
        work.wait()
    else:
        store.wait(["dpbook_async_probe"])
        dist.all_reduce(probe)
    dist.barrier()
    if rank == 0:
        store.delete_key("dpbook_async_probe")
    return result


def _share(obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank, through the current default group."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def store_exchange(rank: int, world_size: int, timeout: float = 30.0) -> dict:
    """Rendezvous by hand on a ``FileStore``: every rank posts its "address", reads the others'.

    ``set``/``get`` are the whole protocol: ``get`` blocks until the key exists, ``add`` is an
    atomic counter. ``init_process_group`` does the same through its own store.
    """
    folder = _share(tempfile.mkdtemp(prefix="dpbook-store-") if rank == 0 else None)
    store = dist.FileStore(os.path.join(folder, "store"), world_size)
    store.set_timeout(datetime.timedelta(seconds=timeout))
    store.set(f"addr/{rank}", f"127.0.0.1, pid {os.getpid()}")
    arrived = store.add("arrived", 1)  # 1 for the first rank to get here, N for the last
    seen = {r: store.get(f"addr/{r}").decode() for r in range(world_size)}
    # The destructor of a FileStore opens its file once more (it counts finished workers and
    # the last one deletes the file), and aborts the process if the folder is gone by then.
    # So every rank drops its store first, and the folder goes only after all have.
    del store
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return {"arrived": arrived, "seen": seen}


def _init_url(method: str, plan: dict) -> str:
    if method == "file":
        return "file://" + os.path.join(plan["dir"], "rendezvous")
    if method == "tcp":
        return f"tcp://127.0.0.1:{plan['tcp']}"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(plan["env"]))
    return "env://"  # RANK and WORLD_SIZE are read from the environment too


def init_methods(rank: int, world_size: int, timeout: float = 30.0) -> dict:
    """Re-create the default group with each ``init_method`` and all-reduce ``rank + 1``.

    Rank 0 picks a folder and two free ports and shares them through the group that ``spawn``
    made; then every rank destroys the group and joins a new one three times. The last group
    (``env://``) stays as the default group, as ``spawn`` expects.
    """
    backend = dist.get_backend()
    plan = _share({"dir": tempfile.mkdtemp(prefix="dpbook-init-"), "tcp": free_port(),
                   "env": free_port()} if rank == 0 else None)
    wait = datetime.timedelta(seconds=timeout)
    results = {}
    for method in INIT_METHODS:
        url = _init_url(method, plan)
        dist.destroy_process_group()
        t0 = time.perf_counter()
        if method == "env":
            dist.init_process_group(backend, init_method=url, timeout=wait)
        else:
            dist.init_process_group(backend, init_method=url, rank=rank,
                                    world_size=world_size, timeout=wait)
        seconds = time.perf_counter() - t0
        x = torch.tensor([float(rank + 1)], device=device())
        dist.all_reduce(x)
        results[method] = {"url": url, "seconds": seconds, "sum": x.item(),
                           "rank": dist.get_rank(), "world_size": dist.get_world_size()}
    dist.barrier()
    if rank == 0:
        shutil.rmtree(plan["dir"], ignore_errors=True)
    return results


@contextlib.contextmanager
def _quiet_stderr_fd():
    """Send file descriptor 2 to /dev/null: the profiler's C++ side logs a line there at every
    start and stop, which Jupyter would show in the page."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def backend_ops(rank: int, world_size: int, numel: int = 1024) -> dict:
    """The backend operations that one reduce-scatter and one all-gather become, as the
    profiler records them (names such as ``gloo:all_gather``)."""
    int_at_least("numel", numel)
    dev, prefix = device(), dist.get_backend() + ":"
    full = torch.ones(numel * world_size, device=dev)
    shard = torch.ones(numel, device=dev)
    calls = {"reduce_scatter": lambda: reduce_scatter_flat(shard, full),
             "all_gather": lambda: all_gather_flat(full, shard)}
    ops = {}
    for name, call in calls.items():
        with _quiet_stderr_fd(), torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            call()
            sync(dev)
        ops[name] = sorted({e.name for e in prof.events() if e.name.startswith(prefix)})
    return ops


def primitives_tour(rank: int, world_size: int) -> dict:
    """Everything above in one launch, keyed by topic."""
    return {
        "backend_ops": backend_ops(rank, world_size),
        "whoami": whoami(rank, world_size),
        "collectives": run_collectives(rank, world_size),
        "ring": ring_pass(rank, world_size),
        "average": average(rank, world_size),
        "barrier": barrier_wait(rank, world_size),
        "async": async_overlap(rank, world_size),
        "store": store_exchange(rank, world_size),
        "init": init_methods(rank, world_size),
    }
