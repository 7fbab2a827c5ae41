"""Common failures of multi-process training, each reproduced by a small function (section 4.2.5).

Processes and communication: a worker that child processes cannot import, a port already in
use, ranks with uneven numbers of batches (a hang, and ``Join`` as the fix), parameters that
take no part in the forward pass, a rank that crashes, and ``NCCL_DEBUG``. Then the failures about
state: the ``module.`` prefix of a DDP ``state_dict``, a checkpoint written by every rank or read
before it exists, ``torch.load`` without ``map_location``, and BatchNorm statistics that differ
between ranks.

Every rank function takes ``(rank, world_size, ...)`` and is meant for ``launch.spawn``; a flag
switches between the faulty code and its fix, so the page runs the same function twice."""

from __future__ import annotations

import contextlib
import datetime
import glob
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from ..checks import int_at_least, non_negative, one_of
from ..data import rank_batch, synthetic_regression
from ..launch import device
from ..measure import CommLog
from ..models import build_mlp
from ..train import apply_ddp, full_state_dict, train_step

IN_DIM, OUT_DIM = 16, 4  # build_mlp's defaults

# A notebook cell run as a program: ``python -c`` gives it a ``__main__`` with no file, as
# Jupyter does, so spawn's children cannot find ``worker`` there.
RAW_SPAWN_PROGRAM = textwrap.dedent("""\
    import torch.multiprocessing as mp

    def worker(rank):
        print(f"rank {rank} đang chạy")

    if __name__ == "__main__":
        mp.spawn(worker, nprocs=2)
""")


@dataclass(frozen=True)
class ProgramRun:
    """What a program run in a subprocess left: exit status, output, whether it was killed."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def run_program(code: str, timeout: float = 60.0, env: dict | None = None) -> ProgramRun:
    """Run ``python -c code`` in a new session; on timeout kill its whole process group, so no
    grandchild (a spawned rank) survives."""
    non_negative("timeout", timeout)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout)
        return ProgramRun(proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return ProgramRun(proc.returncode, out, err, True)


def matching_lines(text: str, *needles: str) -> list[str]:
    """The lines of ``text`` containing one of ``needles``, without repeats, in order: the
    relevant lines of a long real message."""
    seen, out = set(), []
    for line in text.splitlines():
        if any(n in line for n in needles) and line.strip() not in seen:
            seen.add(line.strip())
            out.append(line.rstrip())
    return out


@contextlib.contextmanager
def busy_port():
    """Hold a listening socket on a free local port, as a previous run that is still alive
    would; yields the port number."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
    finally:
        sock.close()


def init_on_port(port: int, timeout: float = 5.0) -> str:
    """``init_process_group`` (gloo, one rank) with ``init_method=tcp://127.0.0.1:<port>``, as
    a script with ``MASTER_PORT=<port>`` would; destroys the group and returns its backend."""
    int_at_least("port", port, 0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        return dist.get_backend()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# Uneven inputs: one rank has one more batch than the others.

def uneven_inputs(rank: int, world_size: int, batches: tuple = (3, 2), join: bool = False,
                  collective_timeout: float = 3.0, batch_size: int = 4) -> dict:
    """Rank function: DDP training where rank ``r`` has ``batches[r]`` batches, as when each
    rank reads its own file and the files differ in length. DDP communicates through a group
    whose collectives time out after ``collective_timeout`` s, so the hang ends quickly; a rank
    out of data goes on to the ``dist.barrier()`` that ends the epoch. ``join=True`` wraps the
    loop in ``Join([model])``: a rank out of data then shadows the others' AllReduce."""
    from torch.distributed.algorithms.join import Join

    if len(batches) != world_size:
        raise ValueError(f"batches cần {world_size} phần tử (một cho mỗi rank), có {batches}.")
    group = dist.new_group(timeout=datetime.timedelta(seconds=collective_timeout))
    model = apply_ddp(build_mlp(seed=0), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = synthetic_regression(batches[rank] * batch_size, seed=rank).tensors
    dev, n = device(), batches[rank]
    with CommLog() as log, Join([model]) if join else contextlib.nullcontext():
        for i in range(n):
            s = slice(i * batch_size, (i + 1) * batch_size)
            train_step(model, optimizer, x[s].to(dev), y[s].to(dev))
            print(f"rank {rank}: xong batch {i + 1}/{n}")
    print(f"rank {rank}: hết dữ liệu, vào dist.barrier() cuối epoch")
    dist.barrier()
    return {"rank": rank, "steps": n, "state": full_state_dict(model),
            "collectives": [(r.collective, r.nbytes) for r in log.records]}


def collective_calls(batches: tuple) -> list[list[str]]:
    """The collectives each rank issues in ``uneven_inputs`` without ``Join``: one AllReduce
    of the gradients per batch (the small MLP fits in one bucket and has no buffers to
    broadcast), then the barrier that ends the epoch."""
    for r, n in enumerate(batches):
        int_at_least(f"batches[{r}]", n)
    return [["AllReduce"] * n + ["barrier"] for n in batches]


def per_rank_counts(dataset_size: int, world_size: int, batch_size: int,
                    drop_last: bool = False) -> list[tuple[int, int]]:
    """``(samples, batches)`` that a ``DataLoader`` over a ``DistributedSampler`` gives each
    rank: the sampler pads the data (repeating a few samples) or, with ``drop_last``, trims
    it, so that every rank gets the same number of samples, hence of batches."""
    for name, value in (("dataset_size", dataset_size), ("world_size", world_size),
                        ("batch_size", batch_size)):
        int_at_least(name, value)
    data, out = range(dataset_size), []
    for r in range(world_size):
        sampler = DistributedSampler(data, num_replicas=world_size, rank=r, shuffle=False,
                                     drop_last=drop_last)
        out.append((len(sampler), len(DataLoader(data, batch_size=batch_size, sampler=sampler))))
    return out


# --------------------------------------------------------------------------------------------
# Unused parameters.

class AuxHeadNet(nn.Module):
    """A body, a main head and an auxiliary head that ``forward`` uses only when asked: in a
    plain training step ``aux_head`` gets no gradient."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(IN_DIM, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, OUT_DIM)
        self.aux_head = nn.Linear(hidden, OUT_DIM)

    def forward(self, x: torch.Tensor, use_aux: bool = False) -> torch.Tensor:
        h = self.body(x)
        return self.head(h) + (self.aux_head(h) if use_aux else 0)


def unused_parameters(rank: int, world_size: int, steps: int = 3, batch_size: int = 4,
                      **ddp_kwargs) -> dict:
    """Rank function: train ``AuxHeadNet`` with DDP (``ddp_kwargs`` go to the wrapper, e.g.
    ``find_unused_parameters=True``); returns the losses, whether ``aux_head`` ever got a
    gradient, the final weights, and ``rebuilt_at``: the step (1-based) whose forward rebuilt
    DDP's buckets (``DistributedDataParallel._has_rebuilt_buckets`` turned true), ``None`` if
    none did."""
    int_at_least("steps", steps)
    torch.manual_seed(0)  # same weights on every rank (DDP would broadcast them anyway)
    model = apply_ddp(AuxHeadNet(), **ddp_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = synthetic_regression(steps * batch_size * world_size).tensors
    dev, losses, aux_grad, rebuilt_at = device(), [], False, None
    for step in range(steps):
        xb, yb = rank_batch((x, y), rank, batch_size, dev, start=step * world_size * batch_size)
        out = model(xb)
        if rebuilt_at is None and model._has_rebuilt_buckets:
            rebuilt_at = step + 1
        loss = nn.functional.mse_loss(out, yb)
        loss.backward()
        aux_grad |= model.module.aux_head.weight.grad is not None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses, "aux_grad": aux_grad, "state": full_state_dict(model),
            "rebuilt_at": rebuilt_at}


# --------------------------------------------------------------------------------------------
# A rank that crashes.

def crash(rank: int, world_size: int, bad_rank: int = 1, bad_step: int = 1, steps: int = 3,
          batch_size: int = 4, collective_timeout: float = 10.0) -> list[float]:
    """Rank function: DDP training in which rank ``bad_rank`` gets, at step ``bad_step``, a
    batch with one feature missing (a corrupt sample), so its forward raises.

    Under gloo it closes, before raising, the group DDP communicates through, as its process's
    death would; the other ranks, waiting in the AllReduce, print the error this gives them,
    then raise it. Under NCCL closing is itself collective (``destroy_process_group`` would wait
    for the peers stuck in the AllReduce), so it only raises: the launcher aborts its
    communicators, and a peer's AllReduce ends at the group's ``collective_timeout``, when
    NCCL's watchdog stops that process."""
    group = dist.new_group(timeout=datetime.timedelta(seconds=collective_timeout))
    model = apply_ddp(build_mlp(seed=0), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = synthetic_regression(steps * batch_size, seed=rank).tensors
    dev, losses = device(), []
    try:
        for step in range(steps):
            s = slice(step * batch_size, (step + 1) * batch_size)
            xb = x[s][:, :-1] if (rank, step) == (bad_rank, bad_step) else x[s]  # 15 features
            losses.append(train_step(model, optimizer, xb.to(dev), y[s].to(dev)))
    except Exception as exc:
        if rank != bad_rank:
            first = str(exc).strip().splitlines()[0]
            print(f"rank {rank} dừng ở bước {step} với {type(exc).__name__}: {first}")
        elif dist.get_backend(group) != "nccl":
            dist.destroy_process_group(group)  # what the dying process's closed sockets do
        raise
    return losses


def scenarios(rank: int, world_size: int, runs: list) -> dict:
    """Rank function: run several rank functions one after the other in the same processes,
    saving one start-up per run; ``runs`` is a list of ``(label, fn, kwargs)``. An exception is
    caught and recorded as ``{"error": (type name, message)}``, the others as
    ``{"result": ...}``. Only for failures that hit every rank at the same point, or none
    that leaves a collective half-done: a rank stuck in a collective would stall the rest."""
    out = {}
    for label, fn, kwargs in runs:
        try:
            out[label] = {"result": fn(rank, world_size, **kwargs)}
        except Exception as exc:  # noqa: BLE001 - the point is to show the real error
            out[label] = {"error": (type(exc).__name__, str(exc))}
        dist.barrier()  # the next run starts together on every rank
    return out


# --------------------------------------------------------------------------------------------
# NCCL_DEBUG (GPU only).

@contextlib.contextmanager
def env_vars(**values: str):
    """Set environment variables for the block (child processes started inside inherit them),
    then restore the previous values."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def all_reduce_once(rank: int, world_size: int) -> float:
    """Rank function: one AllReduce of a one-element tensor on this rank's device (under NCCL,
    enough to create the communicator and make ``NCCL_DEBUG=INFO`` log its set-up)."""
    t = torch.ones(1, device=device()) * (rank + 1)
    dist.all_reduce(t)
    return t.item()


def read_logs(pattern: str, max_lines: int = 40) -> list[str]:
    """The first ``max_lines`` lines of the files matching ``pattern`` (e.g. the files that
    ``NCCL_DEBUG_FILE`` produced), file after file."""
    lines: list[str] = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines += [line.rstrip() for line in f]
    return lines[:max_lines]


IN_DIM, OUT_DIM = 16, 4  # build_mlp's defaults
WRITERS = ("rank0", "every")


def save_and_load(rank: int, world_size: int, path: str, writers: str = "rank0",
                  unwrap: bool = True, barrier: bool = True, write_delay: float = 0.0,
                  map_location: bool = True) -> dict:
    """Rank function: one DDP step, then a checkpoint and every rank reading it back.

    ``writers``: ``"rank0"`` (only rank 0 calls ``torch.save``) or ``"every"`` (each rank
    does, on the same path). ``unwrap``: save ``ddp.module.state_dict()`` rather than
    ``ddp.state_dict()``. ``barrier``: wait for every rank before loading. ``write_delay``:
    seconds the writer spends before the file appears (a large checkpoint). ``map_location``:
    load onto this rank's device rather than onto the device recorded in the file.
    Returns whether this rank wrote and when, the saved keys, the load error (type, message)
    or ``None``, and the devices of the loaded tensors.
    """
    one_of("writers", writers, WRITERS)
    non_negative("write_delay", write_delay)
    dev = device()
    model = apply_ddp(build_mlp(seed=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = synthetic_regression(4 * world_size).tensors
    train_step(model, optimizer, x[4 * rank:4 * rank + 4].to(dev), y[4 * rank:4 * rank + 4].to(dev))
    state = (model.module if unwrap else model).state_dict()  # tensors stay on dev, as usual
    window = None
    if writers == "every" or rank == 0:
        time.sleep(write_delay)
        start = time.time()
        torch.save(state, path)
        window = (start, time.time())
    if barrier:
        dist.barrier()
    try:
        loaded = torch.load(path, map_location=dev if map_location else None)
        error, devices = None, sorted({str(t.device) for t in loaded.values()})
    except Exception as exc:  # noqa: BLE001 - the page shows the real error
        error, devices = (type(exc).__name__, str(exc)), []
    return {"rank": rank, "wrote": window is not None, "window": window, "keys": list(state),
            "error": error, "devices": devices}


def save_as_if_on_gpu(obj, path: str, location: str = "cuda:0") -> None:
    """``torch.save(obj, path)``, recording every storage as living on ``location``: the file
    a GPU machine writes for tensors on that GPU. Lets a CPU-only machine see what loading a
    GPU checkpoint does. Checks the tags it wrote."""
    import torch.serialization as ser

    original = ser.location_tag
    ser.location_tag = lambda storage: location  # what torch.save asks for each storage
    try:
        torch.save(obj, path)
    finally:
        ser.location_tag = original
    if set(storage_locations(path)) != {location}:
        raise RuntimeError("Không ghi được thẻ thiết bị mong muốn: torch.save đã đổi cách làm.")


def storage_locations(path: str) -> list[str]:
    """The device tag recorded for each storage of a checkpoint. ``map_location`` given as a
    function receives ``(storage, tag)`` with the storage already on the CPU; returning it
    keeps it there, so no device is touched."""
    tags: list[str] = []
    torch.load(path, map_location=lambda storage, tag: (tags.append(tag), storage)[1])
    return tags


def batchnorm_model(seed: int = 0) -> nn.Sequential:
    """A ``BatchNorm1d`` on the raw inputs in front of ``build_mlp(seed)``: its running mean
    should estimate the mean of the data."""
    return nn.Sequential(OrderedDict(norm=nn.BatchNorm1d(IN_DIM), mlp=build_mlp(seed=seed)))


def _batch(rank: int, world_size: int, batch_size: int, shift: float, mixed: bool, g):
    """Rank ``r``'s own data have mean ``r * shift``; ``mixed``: each sample comes from a
    random rank's distribution, as after a global shuffle."""
    x = torch.randn(batch_size, IN_DIM, generator=g)
    if mixed:
        return x + shift * torch.randint(world_size, (batch_size, 1), generator=g)
    return x + shift * rank


def batchnorm_drift(rank: int, world_size: int, shift: float = 4.0, steps: int = 30,
                    batch_size: int = 8, mixed: bool = False) -> dict:
    """Rank function: DDP (``broadcast_buffers=True``, the default) over ``batchnorm_model``,
    rank ``r`` training on inputs of mean ``r * shift`` (each rank reads its own, differently
    distributed, shard) or, ``mixed``, on batches that mix every rank's distribution.

    Returns the feature-averaged running mean after each step, and for the last step the
    running mean when the BatchNorm started (after DDP's broadcast from rank 0), the mean of
    the local batch it normalised with, the final running mean, and the momentum.
    """
    int_at_least("steps", steps)
    non_negative("shift", shift)
    dev = device()
    model = apply_ddp(batchnorm_model())
    norm = model.module.norm
    seen: dict = {}
    norm.register_forward_pre_hook(lambda m, args: seen.update(
        before=m.running_mean.detach().cpu().clone(), batch_mean=args[0].detach().mean(0).cpu()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1000 + rank)
    history = []
    for _ in range(steps):
        x = _batch(rank, world_size, batch_size, shift, mixed, g)
        y = torch.randn(batch_size, OUT_DIM, generator=g)
        train_step(model, optimizer, x.to(dev), y.to(dev))
        history.append(norm.running_mean.mean().item())
    return {"rank": rank, "history": history, "before": seen["before"],
            "batch_mean": seen["batch_mean"], "final": norm.running_mean.detach().cpu().clone(),
            "momentum": norm.momentum}
