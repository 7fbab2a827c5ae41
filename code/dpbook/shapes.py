"""Shapes of the models whose memory the chapter counts, and their parameter counts.

Parameter counts are computed from the architecture, not typed in: ``num_params_of`` is the
closed form, ``meta_model`` builds the same shapes on ``torch.device("meta")`` (no memory) so the
tests can check one against the other.

FSDP units, as the chapter wraps a model (``fully_shard`` on every Transformer layer, then on the
root): ``largest_unit`` is the biggest layer unit, ``root_unit`` what the root keeps for itself
(the embeddings, the final norm and, when it is not tied to the embedding, the output head). The
root's AllGather runs in its pre-forward hook, before the first layer, and its parameters are
resharded only after the whole backward (FSDP2 does not even reshard it after forward by
default), so in a step a rank holds the root unsharded *and* the layer it computes:
``memory.vram_ledger(..., phase="step")`` adds both.

``presets()`` are the models the VRAM ledger calculator (``widgets.ledger``) offers; nothing
here draws.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Transformer:
    """The shape of a decoder-only Transformer. ``style``: "gpt2" (LayerNorm with bias, biased
    linears, learned positions, tied head) or "llama" (RMSNorm, no biases, SwiGLU MLP with three
    matrices, untied head, ``kv_heads`` < ``heads`` for grouped-query attention)."""

    vocab: int
    d_model: int
    layers: int
    heads: int
    mlp: int
    style: str = "llama"
    kv_heads: int | None = None
    context: int = 0

    @property
    def d_kv(self) -> int:
        return self.d_model * (self.kv_heads or self.heads) // self.heads


def layer_params(s: Transformer) -> int:
    """Parameters of one Transformer layer (attention, MLP, two norms)."""
    d = s.d_model
    if s.style == "gpt2":
        return (d * 3 * d + 3 * d) + (d * d + d) + (d * s.mlp + s.mlp) + (s.mlp * d + d) + 4 * d
    return 2 * d * d + 2 * d * s.d_kv + 3 * d * s.mlp + 2 * d


def num_params_of(s: Transformer) -> int:
    """Closed form: embeddings, layers, final norm and (untied) output head."""
    embed = s.vocab * s.d_model + s.context * s.d_model
    if s.style == "gpt2":
        return embed + s.layers * layer_params(s) + 2 * s.d_model  # head tied to wte
    return 2 * embed + s.layers * layer_params(s) + s.d_model


def meta_model(s: Transformer):
    """The same shapes as real ``nn.Module``s on the meta device: sizes without memory."""
    import torch
    from torch import nn

    gpt2 = s.style == "gpt2"
    norm = (lambda: nn.LayerNorm(s.d_model)) if gpt2 else (lambda: nn.RMSNorm(s.d_model))
    lin = functools.partial(nn.Linear, bias=gpt2)

    def layer():
        attn = [lin(s.d_model, 3 * s.d_model)] if gpt2 else \
            [lin(s.d_model, s.d_model), lin(s.d_model, 2 * s.d_kv)]
        mlp = [lin(s.d_model, s.mlp), lin(s.mlp, s.d_model)]
        mlp += [] if gpt2 else [lin(s.d_model, s.mlp)]  # SwiGLU's third matrix
        return nn.ModuleList([norm(), *attn, lin(s.d_model, s.d_model), norm(), *mlp])

    with torch.device("meta"):
        parts = [nn.Embedding(s.vocab, s.d_model), *(layer() for _ in range(s.layers)), norm()]
        parts += [nn.Embedding(s.context, s.d_model)] if s.context else []
        parts += [] if gpt2 else [nn.Linear(s.d_model, s.vocab, bias=False)]
        return nn.ModuleList(parts)


@dataclass(frozen=True)
class MLPShape:
    """The shape of the package's MLP (``models.MLP``, whose defaults these are): ``depth``
    blocks (Linear + ReLU) of width ``hidden``, then a linear head."""

    in_dim: int = 16
    hidden: int = 32
    depth: int = 3
    out_dim: int = 4

    def block_params(self) -> tuple[int, ...]:
        dims = [self.in_dim] + [self.hidden] * self.depth
        return tuple(a * b + b for a, b in zip(dims, dims[1:]))

    def num_params(self) -> int:
        return sum(self.block_params()) + self.hidden * self.out_dim + self.out_dim


MLP = MLPShape()


@dataclass(frozen=True)
class Preset:
    label: str
    num_params: int
    largest_unit: int  # parameters of the biggest layer unit (for phase="step")
    root_unit: int = 0  # parameters the root unit keeps: embeddings, final norm, untied head


def root_params(s: Transformer) -> int:
    """Parameters no layer owns, which the root unit keeps when only the layers are wrapped:
    token (and position) embeddings, the final norm and, for LLaMA, the untied output head."""
    return num_params_of(s) - s.layers * layer_params(s)


SHAPES = {
    "gpt2-124m": ("GPT-2 124M", Transformer(50257, 768, 12, 12, 3072, "gpt2", context=1024)),
    "llama-7b": ("LLaMA-7B", Transformer(32000, 4096, 32, 32, 11008)),
    "llama-13b": ("LLaMA-13B", Transformer(32000, 5120, 40, 40, 13824)),
    # Llama 2 70B: grouped-query attention with 8 key/value heads.
    "llama-70b": ("LLaMA-70B", Transformer(32000, 8192, 80, 64, 28672, kv_heads=8)),
}


@functools.cache
def presets() -> dict[str, Preset]:
    """Every preset, the package's small ``MLP`` first (closed form, checked against a real
    instance by the tests)."""
    mlp_root = MLP.num_params() - sum(MLP.block_params())  # the head
    out = {"mlp": Preset("MLP nhỏ (dpbook)", MLP.num_params(), max(MLP.block_params()), mlp_root)}
    for key, (label, s) in SHAPES.items():
        out[key] = Preset(label, num_params_of(s), layer_params(s), root_params(s))
    return out
