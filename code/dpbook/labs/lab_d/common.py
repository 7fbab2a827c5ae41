"""What every version of lab D shares: the model the checker trains, its data, the sizes.

``LabNet`` is a four-layer MLP with one buffer (``center``, subtracted from the input): the
buffer is what shows that ``MyDDP`` broadcasts buffers as well as parameters. Its layers differ
in size, so that ``CAP_MB`` cuts its gradients into three buckets (``dpbook.buckets``).
"""

from __future__ import annotations

import torch
from torch import nn

D_IN, D_OUT = 32, 8
CAP_MB = 0.02  # 20 971 byte: three buckets for LabNet (bucket 0 holds fc4 and fc3)
STEPS = 5  # SGD steps compared with PyTorch's DDP
LR = 0.1
BATCH = 16  # samples per rank and step
RING_SHAPES = ((8,), (7,), (1,), (3, 5), (1000,), (1001,))  # several not divisible by N = 2


class LabNet(nn.Module):
    """``fc1`` 32->64, ``fc2`` 64->128, ``fc3`` 128->64, ``fc4`` 64->8, ReLU between, and a
    buffer ``center`` subtracted from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("center", torch.randn(D_IN))
        self.fc1, self.fc2 = nn.Linear(D_IN, 64), nn.Linear(64, 128)
        self.fc3, self.fc4 = nn.Linear(128, 64), nn.Linear(64, D_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x - self.center))
        x = torch.relu(self.fc2(x))
        return self.fc4(torch.relu(self.fc3(x)))


def build_model(seed: int = 0) -> LabNet:
    """A ``LabNet`` whose weights and buffer are fixed by ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LabNet()


def batch(rank: int, step: int, device: torch.device | str = "cpu"):
    """``(x, y)``: rank ``rank``'s own batch of step ``step`` (every rank a different one)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)
    return x.to(device), y.to(device)
