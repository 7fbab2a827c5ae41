"""The DDP-bucket animation: frames of one backward pass with buckets (which bucket fills, waits,
is reduced), the player and live controls. The SVG of each frame is drawn by
``dpbook.widgets.buckets_svg``.

The buckets themselves come from ``dpbook.buckets`` (the same assignment as PyTorch's), the times
from ``bucket_timeline`` (alpha-beta model or a run recorded by ``dpbook.tracing.ddp_buckets``); every
figure says which source its times come from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .. import vi
from ..tracing.ddp_buckets import CAP_CHOICES_MB, DEFAULT_BATCH
from ..buckets import Param, cap_limits, model_params, ready_order
from ..checks import non_negative, one_of
from ..models import BUCKET_NET_D_IN, build_bucket_net
from .bucket_timeline import (DEFAULT_ALPHA, DEFAULT_BANDWIDTH, DEFAULT_WORLD_SIZE, LayerSpan,
                              Timeline, alpha_beta_timeline, compare_strategies, measured_timeline)
from .player import Frame, Player

FIRST_CAP_CHOICES_MB = (0.01, 0.02, 0.05, 0.1)
SOURCES = ("alpha-beta", "measured")


# --------------------------------------------------------------------------------------------
# Frames (pure)

BucketStatus = str  # "empty", "filling", "waiting", "reducing", "done"


@dataclass(frozen=True)
class StepFrame:
    """The state at time ``now``: after layer ``layer`` (None: before backward; the last frame
    has ``final=True`` and ``now = total``)."""

    timeline: Timeline
    now: float
    layer: str | None
    filled: tuple[int, ...]  # bytes of each bucket whose gradient is ready
    status: tuple[BucketStatus, ...]
    caption: str
    final: bool


EPS = 1e-12


def bucket_status(tl: Timeline, now: float) -> tuple[tuple[int, ...], tuple[BucketStatus, ...]]:
    """Bytes ready and status of each bucket at ``now``."""
    filled, status = [], []
    for b, c in zip(tl.buckets, tl.comms):
        f = sum(tl.params[i].nbytes for i in b.params if tl.param_ready[i] <= now + EPS)
        filled.append(f)
        if c.end <= now + EPS:
            status.append("done")
        elif c.start <= now + EPS:
            status.append("reducing")
        elif f == b.nbytes:
            status.append("waiting")
        else:
            status.append("filling" if f else "empty")
    return tuple(filled), tuple(status)


def build_frames(tl: Timeline) -> list[StepFrame]:
    """One frame before backward, one per layer whose gradients become ready, and a last frame
    with the whole timeline and the no-overlap baseline."""
    frames = [_frame(tl, 0.0, None, "Trước backward: các bucket còn trống. "
                     f"{len(tl.buckets)} bucket, xếp theo thứ tự gradient sẵn sàng "
                     "(tầng cuối của lượt truyền xuôi có gradient trước).")]
    prev = 0.0
    for span in tl.layers:
        frames.append(_frame(tl, span.end, span.name, _layer_caption(tl, span, prev)))
        prev = span.end
    return frames + [_frame(tl, tl.total, None, _final_caption(tl), final=True)]


def _frame(tl, now, layer, caption, final=False) -> StepFrame:
    filled, status = bucket_status(tl, now)
    return StepFrame(tl, now, layer, filled, status, caption, final)


def _layer_caption(tl: Timeline, span: LayerSpan, prev: float) -> str:
    where = sorted({k for k, b in enumerate(tl.buckets) for i in b.params if i in span.params})
    kb = sum(tl.params[i].nbytes for i in span.params) / 1024
    text = (f"t = {vi.ms(span.end)}: tầng {span.name} tính xong gradient ({len(span.params)} "
            f"tensor tham số, {vi.number(kb, 1)} KiB) → vào bucket "
            f"{', '.join(f'B{k}' for k in where)}.")
    full = [c for c in tl.comms if prev + EPS < c.ready <= span.end + EPS]
    for c in full:
        if tl.source == "measured":
            text += (f" B{c.bucket} đủ gradient; DDP gọi comm hook (phát AllReduce) lúc "
                     f"{vi.ms(c.start)}.")
        elif c.start <= c.ready + EPS:
            text += f" B{c.bucket} đủ gradient: AllReduce bắt đầu ngay."
        else:
            text += (f" B{c.bucket} đủ gradient nhưng chờ AllReduce trước xong (bắt đầu lúc "
                     f"{vi.ms(c.start)}).")
    running = [c.bucket for c in tl.comms if c.start < span.end - EPS < c.end - 2 * EPS]
    if running and span is not tl.layers[-1]:
        text += (f" Trong lúc backward tiếp tục, AllReduce của "
                 f"{', '.join(f'B{k}' for k in running)} chạy song song (chồng lấp).")
    return text


def _final_caption(tl: Timeline) -> str:
    gain = tl.baseline_total - tl.total
    return (f"Toàn bộ: backward tính xong lúc {vi.ms(tl.compute_end)}, cả bước (kể cả mọi "
            f"AllReduce) xong lúc {vi.ms(tl.total)}. Không chồng lấp (một AllReduce sau backward): "
            f"{vi.ms(tl.baseline_total)}. Chồng lấp "
            + (f"tiết kiệm {vi.ms(gain)} ({vi.number(100 * gain / tl.baseline_total, 0)}%)."
               if gain > 0 else f"không có lợi ở đây (chậm hơn {vi.ms(-gain)})."))


# --------------------------------------------------------------------------------------------
# Players and live controls

@functools.lru_cache(maxsize=1)
def demo_params() -> tuple[tuple[Param, ...], tuple[int, ...]]:
    """The demo model's parameters and their gradient-ready order (one CPU backward, cached)."""
    model = build_bucket_net()
    return tuple(model_params(model)), tuple(ready_order(model, torch.randn(4, BUCKET_NET_D_IN)))


def player_for(tl: Timeline, presentation: bool = False) -> Player:
    # imported here, not at the top: the renderer imports this module
    from .buckets_svg import render_frame
    frames = [Frame(render_frame(f), f.caption) for f in build_frames(tl)]
    title = ("Bucket của DDP và chồng lấp — "
             + ("mô hình alpha-beta" if tl.source == "alpha-beta" else "đo trên máy này"))
    return Player(frames, title=title, presentation=presentation)


def build_player(bucket_cap_mb: float | None = 0.1, first_bucket_cap_mb: float | None = None,
                 source: str = "alpha-beta", *, traces: dict | None = None,
                 alpha_us: float = DEFAULT_ALPHA * 1e6,
                 bandwidth_gbs: float = DEFAULT_BANDWIDTH / 1e9,
                 world_size: int = DEFAULT_WORLD_SIZE, batch: int = DEFAULT_BATCH,
                 presentation: bool = False) -> Player:
    """The player for the demo model. ``source="measured"`` needs ``traces`` from ``measure``
    holding this ``(bucket_cap_mb, first_bucket_cap_mb)``."""
    one_of("source", source, SOURCES)
    limits = cap_limits(bucket_cap_mb, first_bucket_cap_mb)
    if source == "measured":
        key = (bucket_cap_mb, first_bucket_cap_mb)
        if not traces or key not in traces:
            have = sorted(traces or {}, key=str)
            raise ValueError(f"Chưa đo cấu hình bucket_cap_mb={bucket_cap_mb}, "
                             f"first_bucket_cap_mb={first_bucket_cap_mb}; các cấu hình đã đo: "
                             f"{have or 'không có (hãy chạy measure())'}.")
        return player_for(measured_timeline(traces[key]), presentation)
    non_negative("alpha_us", alpha_us)
    if not bandwidth_gbs > 0:
        raise ValueError(f"bandwidth_gbs phải dương, nhận được {bandwidth_gbs!r}.")
    params, order = demo_params()
    tl = alpha_beta_timeline(params, limits, order, world_size=world_size, alpha=alpha_us * 1e-6,
                             bandwidth=bandwidth_gbs * 1e9, batch=batch)
    return player_for(tl, presentation)


def controls(traces: dict | None = None):
    """Live controls (need a kernel): caps, the time source (if ``traces`` is given), the
    alpha-beta constants, N, presentation mode."""
    import ipywidgets as w

    caps = [(f"{vi.number(c, 2)} MiB", c) for c in CAP_CHOICES_MB] + [("None (DDP: 25 MiB)", None)]
    firsts = [("= bucket_cap_mb", None)] + [(f"{vi.number(c, 2)} MiB", c) for c in FIRST_CAP_CHOICES_MB]
    ctl = {
        "bucket_cap_mb": w.Dropdown(options=caps, value=0.1, description="bucket_cap_mb"),
        "first_bucket_cap_mb": w.Dropdown(options=firsts, value=None, description="bucket đầu"),
        "alpha_us": w.FloatLogSlider(value=DEFAULT_ALPHA * 1e6, base=10, min=0, max=3,
                                     step=0.1, description="α (µs)"),
        "bandwidth_gbs": w.FloatLogSlider(value=DEFAULT_BANDWIDTH / 1e9, base=10, min=-1,
                                          max=2, step=0.1, description="GB/s"),
        "world_size": w.IntSlider(value=DEFAULT_WORLD_SIZE, min=2, max=64, description="N"),
        "presentation": w.Checkbox(value=False, description="trình chiếu"),
    }
    if traces:
        ctl["source"] = w.Dropdown(options=[("mô hình alpha-beta", "alpha-beta"),
                                            ("đo trên máy này", "measured")],
                                   value="alpha-beta", description="thời gian")
    return live(functools.partial(build_player, traces=traces), **ctl)


def live(build, **ctl):  # indirection so tests can import this module without ipywidgets
    from .live import live as _live
    return _live(build, **ctl)


def comparison_player(bucket_cap_mb: float | None = 0.1, presentation: bool = False,
                      **model) -> Player:
    """``compare_strategies`` on the demo model, as a one-frame player."""
    from .buckets_svg import comparison_svg
    params, order = demo_params()
    c = compare_strategies(params, cap_limits(bucket_cap_mb), order, **model)
    names = {"per_param": "mỗi tham số một AllReduce", "buckets": "bucket",
             "no_overlap": "một AllReduce sau backward"}
    caption = (f"Nhanh nhất: {names[c.best]}. Mỗi AllReduce tốn một độ trễ cố định, nên "
               f"{c.n_per_param} AllReduce nhỏ cộng lại đắt; một AllReduce duy nhất thì phải "
               "chờ backward xong mới chạy. Bucket vừa ít lần gửi vừa chồng lên backward.")
    return Player([Frame(comparison_svg(c), caption)], title="So sánh ba cách đồng bộ gradient",
                  presentation=presentation)
