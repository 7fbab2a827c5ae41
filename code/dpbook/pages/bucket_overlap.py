"""The alpha-beta argument for DDP's buckets (section 4.1.4): pure formulas and two figures.

* ``half_size``: the message size at which a ring AllReduce spends as long on its fixed
  latency as on moving bytes, ``N * alpha * bandwidth``; ``transfer_share``: the fraction of an
  AllReduce's time spent moving bytes, ``n / (n + N * alpha * bandwidth)``.
* ``bucket_lower_bound``: no schedule of a bucketed backward can end before the last bucket's
  AllReduce, started when the last gradient is ready, nor before every AllReduce ran once.
* ``cap_sweep``: the alpha-beta step time (``widgets.bucket_timeline``) for a range of caps;
  ``allreduce_cost_figure`` and ``cap_sweep_figure`` draw the AllReduce cost and that sweep,
  with Vietnamese labels.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..buckets import Param, cap_limits
from ..checks import int_at_least, non_negative
from ..costs import alpha_beta_time
from ..widgets.bucket_timeline import (DEFAULT_ALPHA, DEFAULT_BANDWIDTH, DEFAULT_WORLD_SIZE,
                                       Timeline, alpha_beta_timeline, compare_strategies)
from ..style import MIB, PALETTE


def _check(world_size: int, alpha: float, bandwidth: float) -> None:
    int_at_least("world_size", world_size, 2)
    non_negative("alpha", alpha)
    if not bandwidth > 0:
        raise ValueError(f"bandwidth phải dương, nhận được {bandwidth!r}.")


def half_size(world_size: int = DEFAULT_WORLD_SIZE, alpha: float = DEFAULT_ALPHA,
              bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """Bytes ``n`` for which ``2(N-1) alpha == 2(N-1)/N * n / bandwidth``: ``N alpha bandwidth``."""
    _check(world_size, alpha, bandwidth)
    return world_size * alpha * bandwidth


def transfer_share(nbytes: float, world_size: int = DEFAULT_WORLD_SIZE,
                   alpha: float = DEFAULT_ALPHA, bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """Fraction of a ring AllReduce of ``nbytes`` spent moving bytes (the rest is latency)."""
    non_negative("nbytes", nbytes)
    n_half = half_size(world_size, alpha, bandwidth)
    return nbytes / (nbytes + n_half) if nbytes + n_half > 0 else 0.0


def bucket_lower_bound(tl: Timeline, world_size: int = DEFAULT_WORLD_SIZE,
                       alpha: float = DEFAULT_ALPHA,
                       bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """``max(T_compute + T_AR(last bucket), sum_k T_AR(bucket k))`` for the timeline ``tl``."""
    _check(world_size, alpha, bandwidth)
    t = [alpha_beta_time("all_reduce", b.nbytes, world_size, alpha, bandwidth)
         for b in tl.buckets]
    return max(tl.compute_end + t[-1], sum(t))


def cap_sweep(params: Sequence[Param], order: Sequence[int], caps_mb: Sequence[float],
              **model) -> list[tuple[float, int, float]]:
    """``(cap in MiB, number of buckets, alpha-beta step time in s)`` for each cap (the first
    bucket's cap equal to it, as when ``bucket_cap_mb`` is passed to DDP)."""
    out = []
    for cap in caps_mb:
        tl = alpha_beta_timeline(params, cap_limits(cap), order, **model)
        out.append((cap, len(tl.buckets), tl.total))
    return out


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
              label=f"độ trễ 2(N−1)α = {lat * 1e6:g} µs")
    ax.loglog(sizes, [(t - lat) * 1e3 for t in total], color=PALETTE["orange"], lw=2, ls="--",
              label="truyền byte 2(N−1)/N · n/β")
    ax.axvline(n_half, color=PALETTE["vermillion"], lw=1.5)
    ax.text(n_half * 1.4, lat * 1e3 / 30, f"n½ = Nαβ = {n_half / 1e3:g} kB",
            color=PALETTE["vermillion"], fontsize=11)
    ax.set_ylim(lat * 1e3 / 1e3, None)
    ax.set_xlabel("kích thước thông điệp n (byte)")
    ax.set_ylabel("thời gian một AllReduce (ms)")
    ax.set_title(f"Mô hình alpha-beta (α = {alpha * 1e6:g} µs, β = {bandwidth / 1e9:g} GB/s, "
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
