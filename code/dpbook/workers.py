"""Small rank functions for pages and tests: a real collective, and the ways a rank goes wrong.

They live in the package because ``spawn`` can only run functions that child processes import
by name (a function defined in a notebook cannot be sent to a spawned process).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .launch import device


def all_reduce_rank_ids(rank: int, world_size: int, numel: int = 4) -> dict:
    """Each rank contributes ``[rank+1] * numel``; returns what it sent and what it got back."""
    sent = torch.full((numel,), float(rank + 1), device=device())
    got = sent.clone()
    dist.all_reduce(got)
    return {
        "rank": rank,
        "backend": dist.get_backend(),
        "device": str(got.device),
        "sent": sent.cpu().tolist(),
        "received": got.cpu().tolist(),
    }


def say_hello(rank: int, world_size: int) -> int:
    print(f"xin chào từ rank {rank}/{world_size}")
    return rank


def fail_on_rank(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` raises; the others wait in a collective that will never complete."""
    if rank == bad_rank:
        raise ValueError(f"lỗi cố ý ở rank {rank}")
    dist.barrier()
    return rank


def hang_on_rank(rank: int, world_size: int, stuck_rank: int = 1) -> int:
    """Every rank but ``stuck_rank`` joins an all-reduce that ``stuck_rank`` never calls."""
    if rank == stuck_rank:
        time.sleep(3600)
    t = torch.ones(1, device=device())
    dist.all_reduce(t)
    return rank


def exit_abruptly(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` dies without raising (as after a segfault or an OOM kill)."""
    import os

    if rank == bad_rank:
        os._exit(3)
    return rank


NATIVE_MESSAGE = "[E] Watchdog caught collective operation timeout (giả lập)"


def abort_below_python(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` writes ``NATIVE_MESSAGE`` straight to file descriptor 2, past
    ``sys.stderr``, and aborts (SIGABRT), as NCCL's watchdog does on a timed-out collective; the
    others wait in a barrier."""
    import os

    import torch.distributed as dist

    if rank == bad_rank:
        os.write(2, (NATIVE_MESSAGE + "\n").encode())
        os.abort()
    dist.barrier()
    return rank


def touch_cuda_as_a_bug_would(rank: int, world_size: int) -> int:
    """Make this rank look as if it had initialised CUDA (``torch.cuda.is_initialized`` says so),
    as a CPU rank that called ``torch.cuda`` would on a GPU box; for ``launch.NO_CUDA_VAR``."""
    import torch

    torch.cuda.is_initialized = lambda: True
    return rank


def child_pid(rank: int, world_size: int) -> int:
    import os

    return os.getpid()


def all_reduce_values(rank: int, world_size: int, inputs: list[list[float]]) -> list[float]:
    """All-reduce ``inputs[rank]`` (float64) and return the result: the real collective that the
    ring animation simulates, on the same numbers."""
    t = torch.tensor(inputs[rank], dtype=torch.float64, device=device())
    dist.all_reduce(t)
    return t.cpu().tolist()


def identity(rank: int, world_size: int, names: tuple = ()) -> dict:
    """What a rank knows about its own process: pid, parent pid, OS process name, and the
    environment variables ``names`` (None where unset)."""
    import os

    with open(f"/proc/{os.getpid()}/comm", encoding="utf-8") as f:
        comm = f.read().strip()
    return {"pid": os.getpid(), "ppid": os.getppid(), "comm": comm,
            "env": {n: os.environ.get(n) for n in names}}
