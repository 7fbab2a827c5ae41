"""Section 4.1.4 (buckets and overlap): the page's figure, drawn from ``dpbook.overlap`` (the
step time against the bucket cap; the cost of one AllReduce against its size is 4.1.5's), a GPT-2
124M with HF's module names (on the meta device, for its bucket layout), the small models on
which the page checks DDP's first-iteration buckets against a real run (``PROBES``: exercise
4's ``Nguoc``, a tied embedding, a frozen block), the page's gradient-accumulation run, and the
text of its reports (a timeline in one line, the bucket layouts of
``tracing.ddp_run.rebuild_runs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..accumulation import accumulate_worker, reference_gradient
from ..buckets import (Bucket, DdpSetting, Param, cap_limits, model_params, ready_order,
                       rebuilt_buckets, step_buckets)
from ..launch import describe_mode, spawn
from ..models import BUCKET_NET_D_IN, build_bucket_net, seeded
from ..overlap import (DEFAULT_ALPHA, DEFAULT_BANDWIDTH, DEFAULT_WORLD_SIZE, cap_sweep,
                       compare_strategies, half_size)
from ..shapes import SHAPES
from ..tracing.ddp_run import BUCKET_NET, Probe, bucket_net_input
from ..style import MIB, PALETTE
from .. import vi

GPT2 = "gpt2-124m"  # the preset's key in shapes.SHAPES


class GPT2Block(nn.Module):
    """One GPT-2 block with HF's names: ``ln_1``, ``attn.c_attn``, ``attn.c_proj``, ``ln_2``,
    ``mlp.c_fc``, ``mlp.c_proj`` (``nn.Linear`` for HF's ``Conv1D``: the same sizes)."""

    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(d, 3 * d), "c_proj": nn.Linear(d, d)})
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(d, hidden), "c_proj": nn.Linear(hidden, d)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.attn["c_attn"](self.ln_1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = (z.transpose(1, 2) for z in qkv.unbind(2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn["c_proj"](y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp["c_proj"](F.gelu(self.mlp["c_fc"](self.ln_2(x))))


class GPT2LM(nn.Module):
    """GPT-2 in HF's order (``wte``, ``wpe``, ``h.0`` … ``h.11``, ``ln_f``) with ``lm_head``
    tied to ``wte``, as ``GPT2LMHeadModel`` does: DDP's parameter list keeps ``wte`` once, at the
    front. Defaults: GPT-2 124M (``shapes.SHAPES["gpt2-124m"]``)."""

    def __init__(self, vocab: int | None = None, context: int | None = None,
                 d: int | None = None, layers: int | None = None, heads: int | None = None,
                 hidden: int | None = None):
        super().__init__()
        s = SHAPES[GPT2][1]
        vocab, context, d = vocab or s.vocab, context or s.context, d or s.d_model
        layers, heads, hidden = layers or s.layers, heads or s.heads, hidden or s.mlp
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.h = nn.ModuleList(GPT2Block(d, heads, hidden) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2_params(model: nn.Module | None = None) -> list[Param]:
    """GPT-2 124M's parameter tensors in DDP's order, from a ``GPT2LM`` on the meta device
    (sizes only, no memory) unless ``model`` is given."""
    return model_params(gpt2_meta() if model is None else model)


def gpt2_meta() -> GPT2LM:
    """GPT-2 124M on the meta device: shapes and autograd, no memory."""
    with torch.device("meta"):
        return GPT2LM()


def gpt2_ready_order(model: nn.Module | None = None, tokens: int = 8) -> list[int]:
    """The order in which GPT-2's gradients become ready in one backward (``ready_order`` on a
    batch of one sequence of ``tokens`` tokens; on the meta device unless ``model`` is given)."""
    model = gpt2_meta() if model is None else model
    device = next(model.parameters()).device
    return ready_order(model, torch.zeros(1, tokens, dtype=torch.long, device=device))


# ------------------------------------------------------------------ the page's probe models


class Nguoc(nn.Module):
    """Exercise 4: modules declared in the reverse of the order they are called in."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 256)  # declared first, used last
        self.body = nn.Linear(64, 64)
        self.inp = nn.Linear(BUCKET_NET_D_IN, 64)  # declared last, used first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(torch.relu(self.inp(x)))))


def build_nguoc(seed: int = 0) -> Nguoc:
    return seeded(Nguoc, seed)


TINY_GPT2 = dict(vocab=256, context=16, d=32, layers=2, heads=2, hidden=128)


def build_tiny_gpt2(seed: int = 0) -> GPT2LM:
    """``GPT2LM`` with tiny sizes (``TINY_GPT2``): the same tied ``wte``/``lm_head``."""
    return seeded(GPT2LM, seed, **TINY_GPT2)


def tiny_gpt2_input(batch: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, TINY_GPT2["vocab"], (batch, 8), generator=generator)


def build_frozen_bucket_net(seed: int = 0) -> nn.Module:
    """BucketNet with block ``b1`` frozen (``requires_grad=False``): DDP leaves it out."""
    model = build_bucket_net(seed)
    model.b1.requires_grad_(False)
    return model


PROBES = {
    "BucketNet": BUCKET_NET,
    "Nguoc": Probe("Nguoc", build_nguoc, bucket_net_input),
    "GPT2 nhỏ (wte = lm_head)": Probe("GPT2 nhỏ (wte = lm_head)", build_tiny_gpt2,
                                       tiny_gpt2_input),
    "BucketNet, b1 đóng băng": Probe("BucketNet, b1 đóng băng", build_frozen_bucket_net,
                                      bucket_net_input),
}


def probe_params(probe: Probe, seed: int = 0) -> tuple[list[Param], list[int]]:
    """A probe's parameters in DDP's order and their gradient-ready order (one backward)."""
    model = probe.build(seed)
    example = probe.example(4, torch.Generator().manual_seed(seed))
    return model_params(model), ready_order(model, example)


@dataclass(frozen=True)
class AccumulationRun:
    """The page's ``no_sync`` run: what each rank returned (``accumulate_worker``), the gradient
    of the whole global batch on one plain model, and the buckets DDP's default caps make of the
    float64 model once rebuilt (the worker warms up first)."""

    mode: str  # how the ranks ran, for the reader
    ranks: list[dict]
    reference: torch.Tensor
    default_buckets: list[Bucket]


def accumulation_run(world_size: int, accumulation_steps: int,
                     micro_batch: int) -> AccumulationRun:
    """Accumulate ``accumulation_steps`` micro-batches on ``world_size`` DDP ranks, each way of
    ``accumulation.MODES``."""
    ranks = spawn(accumulate_worker, world_size=world_size,
                  accumulation_steps=accumulation_steps, micro_batch=micro_batch)
    model = build_bucket_net().double()
    example = torch.randn(4, BUCKET_NET_D_IN, dtype=torch.float64)
    default = rebuilt_buckets(model_params(model), DdpSetting(), ready_order(model, example))
    return AccumulationRun(describe_mode(world_size), ranks,
                           reference_gradient(world_size, accumulation_steps, micro_batch), default)


def cap_sweep_figure(params: Sequence[Param], order: Sequence[int], caps_mb: Sequence[float],
                     world_size: int = DEFAULT_WORLD_SIZE, alpha: float = DEFAULT_ALPHA,
                     bandwidth: float = DEFAULT_BANDWIDTH):
    """Alpha-beta step time of the backward of ``params`` against ``bucket_cap_mb``, with the
    two naive strategies as horizontal lines and ``half_size`` marked."""
    import matplotlib.pyplot as plt

    model = dict(world_size=world_size, alpha=alpha, bandwidth=bandwidth)
    n_half = half_size(world_size, alpha, bandwidth)
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    sweep = cap_sweep(params, order, caps_mb, **model)
    ax.semilogx([c for c, _, _ in sweep], [t * 1e3 for _, _, t in sweep],
                color=PALETTE["green"], lw=2.5, drawstyle="steps-mid", label="có bucket")
    cmp = compare_strategies(params, cap_limits(None), order, **model)
    ax.axhline(cmp.no_overlap * 1e3, color=PALETTE["vermillion"], ls="--", lw=2,
               label="một AllReduce sau backward")
    ax.axhline(cmp.per_param * 1e3, color=PALETTE["purple"], ls=":", lw=2,
               label=f"mỗi tham số một AllReduce ({cmp.n_per_param} lần)")
    ax.axvline(n_half / MIB, color=PALETTE["vermillion"], lw=1.5)
    ax.text(n_half / MIB * 1.1, cmp.per_param * 1e3 * 0.3, "n½", color=PALETTE["vermillion"],
            fontsize=11)
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel("backward + AllReduce (ms)")
    ax.set_title("Thời gian một bước theo giới hạn bucket", loc="left", fontsize=12)
    ax.set_ylim(0, cmp.per_param * 1e3 * 1.15)
    ax.legend(fontsize=10, loc="lower left")
    fig.tight_layout()
    return fig


def timeline_text(name: str, tl) -> str:
    """A ``overlap.Timeline`` in three lines: its buckets, when the first AllReduce starts, when
    the backward and the step end, and the tail left exposed after the backward."""
    sizes = ", ".join(vi.number(b.nbytes, group=vi.NARROW_NBSP) for b in tl.buckets)
    return (f"{name}\n  bucket (byte): {sizes}\n"
            f"  AllReduce đầu tiên bắt đầu lúc {vi.ms(tl.comms[0].start)}; lan truyền ngược xong "
            f"lúc {vi.ms(tl.compute_end)}; cả bước xong lúc {vi.ms(tl.total)} "
            f"(đuôi lộ ra sau lan truyền ngược: {vi.ms(tl.total - tl.compute_end)})")


def layout_text(params: Sequence[Param], layout: Sequence[Sequence[int]]) -> str:
    """One bucket layout as a reader reads it: ``B0 head 65,0 KiB | B1 …``, each bucket with
    the first and last layer it holds (in the order its tensors were packed)."""
    parts = []
    for k, ix in enumerate(layout):
        layers = list(dict.fromkeys(params[i].layer for i in ix))
        span = layers[0] if len(layers) == 1 else f"{layers[0]}…{layers[-1]}"
        kib = sum(params[i].nbytes for i in ix) / 1024
        parts.append(f"B{k} {span} {vi.number(kib, 1)} KiB")
    return " | ".join(parts)


def rebuild_report(runs, params: Sequence[Param]) -> str:
    """The layouts of ``tracing.ddp_run.rebuild_runs`` in the first and the last step, and the
    step whose forward rebuilt them."""
    lines = []
    for r in runs:
        when = (f"dựng lại ở đầu bước {r.rebuilt_at}" if r.rebuilt_at is not None
                else "không bao giờ dựng lại")
        lines.append(f"{r.setting.call()}: {when}")
        lines.append(f"  bước 1: {layout_text(params, r.steps[0])}")
        lines.append(f"  bước {len(r.steps)}: {layout_text(params, r.steps[-1])}")
    return "\n".join(lines)


def matching_steps(run) -> int:
    """How many steps of a ``tracing.ddp_run.RebuildRun`` used exactly the buckets
    ``buckets.step_buckets`` gives for that step (computed from the run's parameter list and
    the ready order it recorded)."""
    return sum(list(layout) == [b.params for b in step_buckets(run.params, run.setting,
                                                                 run.ready_order, k)]
               for k, layout in enumerate(run.steps, start=1))


def probe_report(runs) -> str:
    """One line per probe run: its model and call, the layout of step 1 and of the last step,
    when it was rebuilt, and how many steps equal ``buckets.step_buckets``."""
    lines = []
    for r in runs:
        when = (f"dựng lại ở đầu bước {r.rebuilt_at}" if r.rebuilt_at is not None
                else "không bao giờ dựng lại")
        lines.append(f"{r.model} — {r.setting.call()}: {when}; "
                     f"{matching_steps(r)}/{len(r.steps)} bước trùng step_buckets")
        lines.append(f"  bước 1: {layout_text(r.params, r.steps[0])}")
        if r.steps[-1] != r.steps[0]:
            lines.append(f"  bước {len(r.steps)}: {layout_text(r.params, r.steps[-1])}")
    return "\n".join(lines)
