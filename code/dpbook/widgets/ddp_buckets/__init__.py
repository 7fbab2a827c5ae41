"""The DDP-bucket animation: ``frames`` (pure model), ``render`` (SVG), the static ``player``
(and ``comparison_player``: three ways to synchronise gradients) and the live ``controls``.

The buckets themselves come from ``dpbook.buckets`` (the same assignment as PyTorch's): the layout
DDP uses in the chosen training ``step`` (``buckets.step_buckets``: its first-iteration layout in
step 1, and for ever with ``find_unused_parameters=True``; the rebuilt one from step 2 otherwise).
The times come from ``dpbook.overlap`` (alpha-beta model) or a run recorded by
``dpbook.tracing.ddp_run``.
"""

from __future__ import annotations

import functools

from ... import vi
from ...tracing.ddp_run import CAP_CHOICES_MB, measured_timeline
from ...buckets import DdpSetting, cap_limits, rebuild_step, step_buckets
from ...checks import non_negative, one_of
from ...overlap import (DEFAULT_ALPHA, DEFAULT_BANDWIDTH, DEFAULT_BATCH, DEFAULT_WORLD_SIZE,
                        Timeline, alpha_beta_timeline, compare_strategies)
from ..player import Frame, Player

# The public names of the frame model, at the package level (``render`` stays the module).
from .frames import (FIRST_CAP_CHOICES_MB, SOURCES, BucketStatus, StepFrame, EPS, bucket_status,
                     build_frames, demo_params)
from .render import bucket_colour, comparison_svg, render_frame

__all__ = ["player_for", "player", "controls", "live", "comparison_player", "FIRST_CAP_CHOICES_MB",
           "SOURCES", "BucketStatus", "StepFrame", "EPS", "bucket_status", "build_frames",
           "demo_params", "bucket_colour", "render_frame", "comparison_svg"]


def player_for(tl: Timeline, presentation: bool = False) -> Player:
    frames = [Frame(render_frame(f), f.caption) for f in build_frames(tl)]
    title = ("Bucket của DDP và chồng lấp — "
             + ("mô hình alpha-beta" if tl.source == "alpha-beta" else "đo trên máy này"))
    return Player(frames, title=title, presentation=presentation)


def player(bucket_cap_mb: float | None = 0.1, first_bucket_cap_mb: float | None = None,
           source: str = "alpha-beta", *, traces: dict | None = None,
           alpha_us: float = DEFAULT_ALPHA * 1e6,
           bandwidth_gbs: float = DEFAULT_BANDWIDTH / 1e9,
           world_size: int = DEFAULT_WORLD_SIZE, batch: int = DEFAULT_BATCH,
           step: int = 2, find_unused_parameters: bool = False,
           presentation: bool = False) -> Player:
    """The player for the demo model, with the buckets DDP uses in training step ``step``
    (``buckets.step_buckets``; the default, step 2, is the rebuilt layout unless
    ``find_unused_parameters=True``). ``source="measured"`` needs ``traces`` from ``measure``
    holding this ``(bucket_cap_mb, first_bucket_cap_mb)``; they are recorded after warm-up, with
    ``find_unused_parameters=False``."""
    one_of("source", source, SOURCES)
    setting = DdpSetting(bucket_cap_mb, first_bucket_cap_mb,
                         find_unused_parameters=find_unused_parameters)
    params, order = demo_params()
    layout = step_buckets(params, setting, order, step)  # checks step
    if source == "measured":
        if find_unused_parameters or step < rebuild_step(setting):
            raise ValueError("Số đo chỉ có cho bố cục đã dựng lại (find_unused_parameters=False, "
                             f"step >= 2), nhận được step={step}, "
                             f"find_unused_parameters={find_unused_parameters}.")
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
    at = rebuild_step(setting)
    kind = "initial" if at is None or step < at else "rebuilt"
    tl = alpha_beta_timeline(params, setting.limits, order, world_size=world_size,
                             alpha=alpha_us * 1e-6, bandwidth=bandwidth_gbs * 1e9, batch=batch,
                             layout=layout, layout_kind=kind)
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
        "step": w.Dropdown(options=[("bước 2 trở đi", 2), ("bước 1", 1)], value=2,
                           description="bước"),
        "find_unused_parameters": w.Checkbox(value=False, description="find_unused_parameters"),
        "presentation": w.Checkbox(value=False, description="trình chiếu"),
    }
    if traces:
        ctl["source"] = w.Dropdown(options=[("mô hình alpha-beta", "alpha-beta"),
                                            ("đo trên máy này", "measured")],
                                   value="alpha-beta", description="thời gian")
    return live(functools.partial(player, traces=traces), **ctl)


def live(build, **ctl):  # indirection so tests can import this module without ipywidgets
    from ..live import live as _live
    return _live(build, **ctl)


def comparison_player(bucket_cap_mb: float | None = 0.1, presentation: bool = False,
                      **model) -> Player:
    """``compare_strategies`` on the demo model, built up one way per frame in the order the
    chapter teaches them: one AllReduce after backward, one per parameter, then buckets (the
    last frame shows all three and names the fastest)."""
    params, order = demo_params()
    c = compare_strategies(params, cap_limits(bucket_cap_mb), order, **model)
    names = {"per_param": "mỗi tham số một AllReduce", "buckets": "bucket",
             "no_overlap": "một AllReduce sau backward"}
    than = "chậm hơn" if c.per_param > c.no_overlap else "nhanh hơn"
    captions = (
        f"1. Một AllReduce sau backward: {vi.ms(c.no_overlap)}. Độ trễ cố định chỉ trả một lần, "
        "nhưng AllReduce phải chờ backward xong mới bắt đầu: không byte nào được giấu sau "
        "tính toán.",
        f"2. Mỗi tham số một AllReduce ({c.n_per_param} lần): {vi.ms(c.per_param)}, {than} "
        "cách 1. Mỗi AllReduce được phát ngay khi gradient của tham số đó xong, chồng lên "
        f"backward, nhưng mỗi lần tốn một độ trễ cố định, {c.n_per_param} lần cộng lại.",
        f"3. Bucket ({c.n_buckets} lần): {vi.ms(c.buckets)}. Nhanh nhất: {names[c.best]}. "
        f"Mỗi AllReduce tốn một độ trễ cố định, nên {c.n_per_param} AllReduce nhỏ cộng lại đắt; "
        "một AllReduce duy nhất thì phải chờ backward xong mới chạy. Bucket vừa ít lần gửi vừa "
        "chồng lên backward.",
    )
    frames = [Frame(comparison_svg(c, k + 1), text) for k, text in enumerate(captions)]
    return Player(frames, title="So sánh ba cách đồng bộ gradient", presentation=presentation)
