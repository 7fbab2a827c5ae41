"""Small models for the chapter. They know nothing about parallelism (see ``train.apply_*``)."""

from __future__ import annotations

import torch
from torch import nn

from .. import shapes
from ..checks import int_at_least, one_of


NORMS = (None, "batch")


class Block(nn.Module):
    """Linear + ReLU: the unit that FSDP wraps (one shard unit per block). With
    ``norm="batch"``, a ``BatchNorm1d`` sits between the linear layer and the ReLU: the output
    of a sample then depends on the other samples of its batch (section 4.1.1)."""

    def __init__(self, in_dim: int, out_dim: int, norm: str | None = None):
        super().__init__()
        one_of("norm", norm, NORMS)
        self.linear = nn.Linear(in_dim, out_dim)
        if norm == "batch":
            self.norm = nn.BatchNorm1d(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        if hasattr(self, "norm"):
            x = self.norm(x)
        return torch.relu(x)


class MLP(nn.Module):
    """``depth`` blocks then a linear head. The head belongs to the root module on purpose:
    it shows how FSDP treats parameters that no inner unit owns. ``norm="batch"`` puts a
    ``BatchNorm1d`` in every block."""

    def __init__(self, in_dim: int = shapes.MLP.in_dim, hidden: int = shapes.MLP.hidden,
                 depth: int = shapes.MLP.depth, out_dim: int = shapes.MLP.out_dim,
                 norm: str | None = None):
        super().__init__()
        for name, value in (("in_dim", in_dim), ("hidden", hidden), ("depth", depth),
                            ("out_dim", out_dim)):
            int_at_least(name, value)
        dims = [in_dim] + [hidden] * depth
        self.blocks = nn.ModuleList(Block(a, b, norm) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def num_params(model: nn.Module) -> int:
    """Number of parameters of an unwrapped model."""
    return sum(p.numel() for p in model.parameters())


def seeded(cls, seed: int = 0, **kwargs):
    """``cls(**kwargs)`` with its initial weights fixed by ``seed`` (identical on every rank that
    asks for it), leaving the caller's random state as it was."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return cls(**kwargs)
    finally:
        torch.random.set_rng_state(gen_state)


def build_mlp(seed: int = 0, **kwargs) -> MLP:
    """An ``MLP`` with weights fixed by ``seed``, identical on every rank that asks for it."""
    return seeded(MLP, seed, **kwargs)


# --------------------------------------------------------------------------------------------
# The DDP-bucket demo model: a small Transformer-ish stack whose layers differ in size, so that
# small caps give several buckets, and whose LayerNorms show that DDP follows the
# gradient-ready order (see ``dpbook.buckets``).

BUCKET_NET_D_IN = 32  # input features of the bucket demo model


class BucketBlock(nn.Module):
    """Pre-norm residual MLP block: LayerNorm, Linear d->h, ReLU, Linear h->d."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class BucketNet(nn.Module):
    """``inp`` (32->64), three blocks with hidden widths 128, 256, 512, and a wide ``head``
    (64->256, like a small vocabulary) whose gradient is ready first."""

    def __init__(self, d_in: int = BUCKET_NET_D_IN, d: int = 64, hidden=(128, 256, 512),
                 d_out: int = 256):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        for i, h in enumerate(hidden):
            self.add_module(f"b{i}", BucketBlock(d, h))
        self.n_blocks = len(hidden)
        self.head = nn.Linear(d, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i in range(self.n_blocks):
            x = getattr(self, f"b{i}")(x)
        return self.head(x)


def build_bucket_net(seed: int = 0) -> BucketNet:
    """The bucket demo model with weights fixed by ``seed`` (identical on every rank)."""
    return seeded(BucketNet, seed)
