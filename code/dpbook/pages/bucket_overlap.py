"""Section 4.1.4 (buckets and overlap): the page's two figures, drawn from ``dpbook.overlap``
(the cost of one AllReduce against its size, the step time against the bucket cap), GPT-2's
parameter tensors for the size comparison, the page's gradient-accumulation run, and the text
of its reports (a timeline in one line, the bucket layouts of ``tracing.ddp_run.rebuild_runs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..accumulation import accumulate_worker, reference_gradient
from ..buckets import Bucket, Param, assign_buckets, cap_limits, model_params, ready_order
from ..costs import alpha_beta_time
from ..launch import describe_mode, spawn
from ..models import BUCKET_NET_D_IN, build_bucket_net
from ..overlap import (DEFAULT_ALPHA, DEFAULT_BANDWIDTH, DEFAULT_WORLD_SIZE, cap_sweep,
                       compare_strategies, half_size)
from ..shapes import SHAPES, meta_model
from ..style import MIB, PALETTE
from .. import vi

GPT2 = "gpt2-124m"


def gpt2_params() -> list[Param]:
    """GPT-2 124M's parameter tensors in DDP's order, from a model on the meta device (sizes
    only, no memory)."""
    return model_params(meta_model(SHAPES[GPT2][1]))


@dataclass(frozen=True)
class AccumulationRun:
    """The page's ``no_sync`` run: what each rank returned (``accumulate_worker``), the gradient
    of the whole global batch on one plain model, and the buckets DDP's default caps make of the
    float64 model."""

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
    default = assign_buckets(model_params(model), cap_limits(None), ready_order(model, example))
    return AccumulationRun(describe_mode(world_size), ranks,
                           reference_gradient(world_size, accumulation_steps, micro_batch), default)


def allreduce_cost_figure(world_size: int = DEFAULT_WORLD_SIZE, alpha: float = DEFAULT_ALPHA,
                          bandwidth: float = DEFAULT_BANDWIDTH):
    """One ring AllReduce's alpha-beta time against its size, split into latency and transfer,
    with ``half_size`` marked."""
    import matplotlib.pyplot as plt
    import numpy as np

    n_half = half_size(world_size, alpha, bandwidth)
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    sizes = np.geomspace(1, 1e8, 200)
    lat = 2 * (world_size - 1) * alpha
    total = [alpha_beta_time("all_reduce", n, world_size, alpha, bandwidth) for n in sizes]
    ax.loglog(sizes, [t * 1e3 for t in total], color=PALETTE["black"], lw=2.5,
              label="tổng thời gian")
    ax.loglog(sizes, [lat * 1e3] * len(sizes), color=PALETTE["sky"], lw=2, ls="--",
              label=f"độ trễ 2(N−1)α = {vi.general(lat * 1e6)} µs")
    ax.loglog(sizes, [(t - lat) * 1e3 for t in total], color=PALETTE["orange"], lw=2, ls="--",
              label="truyền byte 2(N−1)/N · n/β")
    ax.axvline(n_half, color=PALETTE["vermillion"], lw=1.5)
    ax.text(n_half * 1.4, lat * 1e3 / 30, f"n½ = Nαβ = {vi.general(n_half / 1e3)} kB",
            color=PALETTE["vermillion"], fontsize=11)
    ax.set_ylim(lat * 1e3 / 1e3, None)
    ax.set_xlabel("kích thước thông điệp n (byte)")
    ax.set_ylabel("thời gian một AllReduce (ms)")
    ax.set_title(f"Mô hình alpha-beta (α = {vi.general(alpha * 1e6)} µs, "
                 f"β = {vi.general(bandwidth / 1e9)} GB/s, "
                 f"N = {world_size})", loc="left", fontsize=12)
    ax.legend(fontsize=10, loc="upper left")
    fig.tight_layout()
    return fig


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
