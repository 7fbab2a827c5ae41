"""The arithmetic of data parallelism (section 4.1.1), in one process: split a batch, average
the per-split gradients plainly or weighted by split size, the weight each sample ends up with,
BatchNorm statistics of a split against those of the whole batch, and the global batch size.

Everything here runs without a process group; ``train.step_gradients`` measures the same
quantities on real ranks.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .checks import int_at_least, one_of

REDUCTIONS = ("mean", "sum")
SCHEMES = ("plain", "weighted")


def check_sizes(sizes: Sequence[int]) -> list[int]:
    """``sizes`` must be a non-empty sequence of positive ints; returns it as a list."""
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes phải có ít nhất một phần tử (số mẫu của mỗi rank).")
    for r, b in enumerate(sizes):
        int_at_least(f"sizes[{r}]", b)
    return sizes


def flat_grad(model: nn.Module) -> torch.Tensor:
    """Every parameter's gradient, flattened and concatenated in ``model.parameters()`` order
    (zeros for a parameter without gradient)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                      for p in model.parameters()]).cpu()


def loss_fn(pred: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The chapter's loss: mean-squared error, averaged (``"mean"``) or summed (``"sum"``) over
    every element of the batch."""
    one_of("reduction", reduction, REDUCTIONS)
    return nn.functional.mse_loss(pred, target, reduction=reduction)


def local_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sizes: Sequence[int],
                    reduction: str = "mean") -> list[torch.Tensor]:
    """Split ``(x, y)`` into consecutive parts of ``sizes`` samples, as ranks would receive them,
    and return the flat gradient of each part's loss: what each rank computes before the
    AllReduce. ``sizes=[len(x)]`` gives the full-batch gradient, ``[1] * len(x)`` the per-sample
    ones. The model's gradients are left cleared."""
    sizes = check_sizes(sizes)
    if sum(sizes) != len(x):
        raise ValueError(f"Tổng sizes = {sum(sizes)} phải bằng số mẫu của batch, {len(x)}.")
    grads, start = [], 0
    for b in sizes:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x[start:start + b]), y[start:start + b], reduction).backward()
        grads.append(flat_grad(model))
        start += b
    model.zero_grad(set_to_none=True)
    return grads


def average(grads: Sequence[torch.Tensor], sizes: Sequence[int] | None = None) -> torch.Tensor:
    """``sizes=None``: the plain mean ``(1/N) sum_r g_r``, what DDP's AllReduce computes.
    Otherwise the mean weighted by part size, ``sum_r (b_r / B) g_r``."""
    if sizes is None:
        return torch.stack(list(grads)).mean(0)
    sizes = check_sizes(sizes)
    if len(sizes) != len(grads):
        raise ValueError(f"Cần một kích thước cho mỗi gradient: {len(sizes)} != {len(grads)}.")
    total = sum(sizes)
    return sum(g * (b / total) for g, b in zip(grads, sizes))


def sample_weights(sizes: Sequence[int], scheme: str = "plain") -> list[float]:
    """The weight each sample's loss gets in the final gradient. ``"plain"``: each rank averages
    over its ``b_r`` samples, then the ranks are averaged, so a sample of rank ``r`` weighs
    ``1 / (N b_r)``. ``"weighted"``: every sample weighs ``1 / B``, as in one process."""
    sizes = check_sizes(sizes)
    one_of("scheme", scheme, SCHEMES)
    n, total = len(sizes), sum(sizes)
    return [1 / (n * b) if scheme == "plain" else 1 / total for b in sizes for _ in range(b)]


def batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and biased variance over the batch (dimension 0): what ``BatchNorm1d``
    normalises with in training mode."""
    return x.mean(0), x.var(0, unbiased=False)


def combine_stats(counts: Sequence[int], means: Sequence[torch.Tensor],
                  variances: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-batch mean and biased variance from the parts' counts, means and biased variances
    (law of total variance): what ``SyncBatchNorm`` computes after gathering them from every
    rank. The full variance is the weighted mean of the variances *plus* the spread of the
    means; averaging the variances alone underestimates it."""
    counts = check_sizes(counts)
    w = torch.tensor(counts, dtype=means[0].dtype) / sum(counts)
    m, v = torch.stack(list(means)), torch.stack(list(variances))
    mean = (w[:, None] * m).sum(0)
    var = (w[:, None] * (v + (m - mean) ** 2)).sum(0)
    return mean, var


def global_batch_size(micro_batch_size: int, accumulation_steps: int, world_size: int) -> int:
    """Samples behind one optimizer step: micro-batch per rank x accumulation steps x ranks."""
    for name, value in (("micro_batch_size", micro_batch_size),
                        ("accumulation_steps", accumulation_steps), ("world_size", world_size)):
        int_at_least(name, value)
    return micro_batch_size * accumulation_steps * world_size
