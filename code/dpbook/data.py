"""Data for the ranks: synthetic data sets (deterministic, tiny, the same on every rank for a
given seed), a rank's slice of a global batch, and the orders ``DistributedSampler`` gives each
rank, epoch after epoch (``sampler_epochs``; ``sampler_orders`` as a rank function, where the
sampler reads rank and world size from the process group)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, TensorDataset

from .checks import int_at_least


def synthetic_regression(num_samples: int = 256, in_dim: int = 16, out_dim: int = 4,
                         seed: int = 0, noise: float = 0.1) -> TensorDataset:
    """``y = x @ W + noise`` for a fixed random teacher ``W``: a task a small MLP can learn."""
    if num_samples < 1 or in_dim < 1 or out_dim < 1:
        raise ValueError(
            f"num_samples, in_dim, out_dim phải dương, nhận được {num_samples}, {in_dim}, {out_dim}."
        )
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, in_dim, generator=g)
    teacher = torch.randn(in_dim, out_dim, generator=g) / in_dim**0.5
    y = x @ teacher + noise * torch.randn(num_samples, out_dim, generator=g)
    return TensorDataset(x, y)


def rank_batch(tensors, rank: int, batch_size: int, device: torch.device,
               start: int = 0) -> tuple[torch.Tensor, ...]:
    """Rank ``rank``'s ``batch_size`` samples of the global batch that begins at sample
    ``start`` (samples ``start + rank * batch_size`` onwards) of each of ``tensors``, on
    ``device``: the rank's own device, where its parameters are."""
    first = start + rank * batch_size
    return tuple(t[first:first + batch_size].to(device) for t in tensors)


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
    dataset = synthetic_regression(dataset_size)
    out = {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
    for key, call in (("without_set_epoch", False), ("with_set_epoch", True)):
        out[key] = _iterate(DistributedSampler(dataset, shuffle=True, seed=seed), epochs, call)
    return out
