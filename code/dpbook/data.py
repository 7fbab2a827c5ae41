"""Synthetic data sets: deterministic, tiny, and the same on every rank for a given seed."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset


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
