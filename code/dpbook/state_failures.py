"""Failures about state (section 4.2.5): the ``module.`` prefix of a DDP ``state_dict``, a
checkpoint written by every rank or read before it exists, ``torch.load`` without
``map_location``, and BatchNorm statistics that differ between ranks.

The failures about processes and communication are in ``dpbook.failures``. Rank functions take
``(rank, world_size, ...)`` and are meant for ``launch.spawn`` (or ``failures.scenarios``).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn

from .checks import int_at_least, non_negative, one_of
from .data import synthetic_regression
from .launch import device
from .models import build_mlp
from .train import apply_ddp, train_step

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
