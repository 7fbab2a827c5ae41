"""The DDP-bucket animation as data: frames of one backward pass with buckets (which bucket
fills, waits, is reduced), from a ``dpbook.overlap.Timeline`` (alpha-beta model or a run
recorded by ``dpbook.tracing.ddp_run``); every caption says which source its times come from.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch

from ... import vi
from ...buckets import Param, model_params, ready_order
from ...models import BUCKET_NET_D_IN, build_bucket_net
from ...overlap import LayerSpan, Timeline

FIRST_CAP_CHOICES_MB = (0.01, 0.02, 0.05, 0.1)
SOURCES = ("alpha-beta", "measured")
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
    frames = [_frame(tl, 0.0, None, "Trước backward: các bucket còn trống. " + _layout_words(tl))]
    prev = 0.0
    for span in tl.layers:
        frames.append(_frame(tl, span.end, span.name, _layer_caption(tl, span, prev)))
        prev = span.end
    return frames + [_frame(tl, tl.total, None, _final_caption(tl), final=True)]


def _layout_words(tl: Timeline) -> str:
    n = len(tl.buckets)
    if tl.layout == "initial" and n == 1 and tl.buckets[0].limit == sys.maxsize:
        return ("1 bucket ở bước 1: với find_unused_parameters=False và không có "
                "bucket_cap_mb_list, DDP để mọi gradient trong một bucket cho tới khi ghi được "
                "thứ tự thật, nên bước này không chồng lấp.")
    if tl.layout == "initial":
        return (f"{n} bucket của bước 1: DDP chưa biết thứ tự gradient, nên xếp theo thứ tự "
                "khai báo tham số rồi đảo danh sách bucket (B0 giữ các tham số khai báo sau "
                "cùng); với find_unused_parameters=True bố cục này giữ mãi.")
    return (f"{n} bucket, xếp theo thứ tự gradient sẵn sàng mà DDP ghi ở bước 1 (tầng cuối của "
            "lượt truyền xuôi có gradient trước).")


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


@functools.lru_cache(maxsize=1)
def demo_params() -> tuple[tuple[Param, ...], tuple[int, ...]]:
    """The demo model's parameters and their gradient-ready order (one CPU backward, cached)."""
    model = build_bucket_net()
    return tuple(model_params(model)), tuple(ready_order(model, torch.randn(4, BUCKET_NET_D_IN)))
