"""A tiny decoder-only Transformer for section 4.2.3: the shape FSDP is made for.

It has what real language models have and the chapter's MLP lacks: an embedding and an output
head that belong to the root module, repeated blocks (attention + feed-forward, each with its
LayerNorm), and a floating-point *buffer* (a sinusoidal position table), so that FSDP's wrap
policies and ``MixedPrecision(buffer_dtype=...)`` have something to act on. Dimensions are tiny
(about 30 thousand parameters) so that it trains on two CPU processes in milliseconds; every
parameter's first dimension is a multiple of 8, so FSDP needs no padding up to 8 ranks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import int_at_least
from . import seeded


class Attention(nn.Module):
    """Causal multi-head self-attention: one ``qkv`` projection, then ``proj``."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} phải chia hết cho n_heads={n_heads}.")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    """``fc1`` (d -> 4d), GELU, ``fc2`` (4d -> d)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm1(x))``, then ``x + ff(norm2(x))``. The unit
    that a transformer wrap policy (and ``fully_shard`` per block) makes one FSDP unit."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d_model), Attention(d_model, n_heads)
        self.norm2, self.ff = nn.LayerNorm(d_model), FeedForward(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


def sinusoidal_positions(seq_len: int, d_model: int) -> torch.Tensor:
    """The fixed sine/cosine position table of the original Transformer, ``seq_len x d_model``."""
    pos = torch.arange(seq_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
    table = torch.zeros(seq_len, d_model)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return table


class TinyTransformer(nn.Module):
    """Token embedding + position buffer, ``depth`` blocks, final LayerNorm, linear head."""

    def __init__(self, vocab: int = 64, d_model: int = 32, n_heads: int = 4, depth: int = 2,
                 seq_len: int = 16):
        super().__init__()
        for name, value in (("vocab", vocab), ("d_model", d_model), ("n_heads", n_heads),
                            ("depth", depth), ("seq_len", seq_len)):
            int_at_least(name, value)
        self.embed = nn.Embedding(vocab, d_model)
        self.register_buffer("pos", sinusoidal_positions(seq_len, d_model))
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_tiny_transformer(seed: int = 0, **kwargs) -> TinyTransformer:
    """A ``TinyTransformer`` with weights fixed by ``seed``, identical on every rank."""
    return seeded(TinyTransformer, seed, **kwargs)


def random_tokens(batch_size: int, seq_len: int = 16, vocab: int = 64, seed: int = 0):
    """Inputs and next-token targets (``tokens[:, 1:]``) drawn from a fixed generator."""
    int_at_least("batch_size", batch_size)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
