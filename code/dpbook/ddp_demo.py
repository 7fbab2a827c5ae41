"""What DDP does around the training loop, seen in real runs (section 4.1.3).

* ``sampler_epochs``: the indices ``DistributedSampler`` gives one rank, epoch after epoch, with
  or without ``set_epoch`` (pure: no process group needed); ``sampler_orders`` is the same as a
  rank function for ``launch.spawn``, where the sampler reads rank and world size from the group.
* ``ddp_lifecycle``: a rank function that builds a model with *its own* random weights
  (``seed=rank``), wraps it in DDP, trains a few steps and records every collective: the
  Broadcast at construction, the buffer Broadcast in each forward, the AllReduce in backward.
  Rank 0 alone logs and saves ``ddp.module.state_dict()``.

They live in the package because ``spawn`` runs only functions that child processes can import.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler

from .checks import int_at_least
from .data import synthetic_regression
from .launch import device
from .measure import CommLog
from .models import build_mlp

IN_DIM, OUT_DIM = 16, 4  # build_mlp's defaults


def sampler_epochs(dataset_size: int, world_size: int, rank: int, epochs: int = 3,
                   call_set_epoch: bool = True, seed: int = 0) -> list[list[int]]:
    """The index order ``DistributedSampler`` yields to ``rank`` in each of ``epochs`` epochs."""
    for name, value in (("dataset_size", dataset_size), ("world_size", world_size),
                        ("epochs", epochs)):
        int_at_least(name, value)
    int_at_least("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank phải nằm trong [0, {world_size - 1}], nhận được {rank}.")
    sampler = DistributedSampler(range(dataset_size), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed)
    return _iterate(sampler, epochs, call_set_epoch)


def _iterate(sampler: DistributedSampler, epochs: int, call_set_epoch: bool) -> list[list[int]]:
    orders = []
    for epoch in range(epochs):
        if call_set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def sampler_orders(rank: int, world_size: int, dataset_size: int = 16, epochs: int = 3,
                   seed: int = 0) -> dict:
    """Rank function: iterate a ``DistributedSampler`` built as in a training script (rank and
    world size taken from the process group) over ``epochs`` epochs, without and with
    ``set_epoch``; returns this rank's index order per epoch for both."""
    dataset = synthetic_regression(dataset_size, IN_DIM, OUT_DIM)
    out = {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
    for key, call in (("without_set_epoch", False), ("with_set_epoch", True)):
        out[key] = _iterate(DistributedSampler(dataset, shuffle=True, seed=seed), epochs, call)
    return out


def demo_model(seed: int) -> nn.Sequential:
    """A BatchNorm (parameters *and* buffers) in front of ``build_mlp(seed)``; one forward pass
    in training mode on ``seed``-dependent data makes the running statistics differ by seed."""
    model = nn.Sequential(OrderedDict(norm=nn.BatchNorm1d(IN_DIM), mlp=build_mlp(seed=seed)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.norm(torch.randn(32, IN_DIM, generator=g) + seed)
    return model


def bytes_by_dtype(tensors) -> dict[str, int]:
    """Total bytes of ``tensors`` grouped by dtype, e.g. ``{"torch.float32": 11408}``."""
    out: dict[str, int] = {}
    for t in tensors:
        out[str(t.dtype)] = out.get(str(t.dtype), 0) + t.numel() * t.element_size()
    return out


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def ddp_lifecycle(rank: int, world_size: int, steps: int = 3, batch_size: int = 8,
                  save_path: str | None = None) -> dict:
    """Rank function: DDP from construction to checkpoint, with every collective recorded.

    Returns this rank's weights before and right after wrapping, the collectives of the
    construction and of each step, the ``state_dict`` keys of the wrapper and of
    ``ddp.module``, the bytes of parameters and buffers by dtype, and the final weights.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    int_at_least("steps", steps)
    model = demo_model(seed=rank)  # every rank starts from different weights, on purpose
    before = _cpu_state(model)
    dev = device()
    with CommLog() as construction:
        ddp = DDP(model.to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    after = _cpu_state(ddp.module)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    ds = synthetic_regression(steps * batch_size * world_size, IN_DIM, OUT_DIM)
    step_records = []
    for step in range(steps):
        start = (step * world_size + rank) * batch_size
        x, y = (t[start:start + batch_size].to(dev) for t in ds.tensors)
        with CommLog() as log:
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_records.append(log.records)
        if rank == 0:  # only rank 0 logs
            print(f"bước {step}: loss cục bộ của rank 0 = {loss.item():.4f}")
    if save_path is not None and rank == 0:  # only rank 0 saves, and the unwrapped model
        torch.save(_cpu_state(ddp.module), save_path)
    dist.barrier()  # no rank goes on (for instance, to load the file) before it is written
    return {
        "rank": dist.get_rank(), "world_size": dist.get_world_size(),
        "backend": dist.get_backend(), "device": str(dev),
        "before": before, "after": after, "final": _cpu_state(ddp.module),
        "construction": construction.records, "steps": step_records,
        "ddp_keys": list(ddp.state_dict()), "module_keys": list(ddp.module.state_dict()),
        "param_bytes": bytes_by_dtype(ddp.module.parameters()),
        "buffer_bytes": bytes_by_dtype(ddp.module.buffers()),
    }
