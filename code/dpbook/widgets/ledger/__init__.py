"""The VRAM ledger per GPU: ``frames`` (pure model, and a real run against the ledger),
``render`` (SVG), the static ``player`` and the live ``controls``.
"""

from __future__ import annotations

import functools

from ...memory import OPTIMIZERS, PRECISIONS, STRATEGIES
from ...shapes import presets
from ...style import GB
from ..player import Frame, Player
from . import render

# The public names of the frame model, at the package level (``render`` stays the module).
from .frames import (WORLD_SIZES, DEFAULT_STRATEGIES, NOTES, Bar, LedgerFrame, fits, verdict,
                     ledger_frames, MEASURED, measured_parallel, compare, measured_frame)
from .render import KINDS, axis_top

__all__ = ["player", "controls", "measured_player", "WORLD_SIZES", "DEFAULT_STRATEGIES", "NOTES",
           "Bar", "LedgerFrame", "fits", "verdict", "ledger_frames", "MEASURED",
           "measured_parallel", "compare", "measured_frame", "KINDS", "axis_top"]


def player(preset: str = "llama-7b", *, presentation: bool = False, **kwargs) -> Player:
    """The static player: one frame per world size (``kwargs`` go to ``ledger_frames``)."""
    frames = ledger_frames(preset, **kwargs)
    top = axis_top(frames)
    label = presets()[preset].label
    return Player([Frame(render.render(f, top), f.caption) for f in frames],
                  title=f"Sổ kế toán VRAM mỗi rank: {label}, N = "
                        + ", ".join(str(f.world_size) for f in frames),
                  presentation=presentation, interval_ms=1800)


def controls(preset: str = "llama-7b"):
    """Live ipywidgets (need a kernel): model, precision, optimizer, phase, strategies…"""
    import ipywidgets as w

    from ..live import live

    def build(activation_gb, **values):
        return player(activation_bytes=activation_gb * GB, **values)

    dd = functools.partial(w.Dropdown, style={"description_width": "initial"})
    return live(
        build,
        preset=dd(options=[(p.label, k) for k, p in presets().items()], value=preset,
                  description="Mô hình"),
        precision=dd(options=PRECISIONS, value="mixed", description="Độ chính xác"),
        optimizer=dd(options=OPTIMIZERS, value="adam", description="Bộ tối ưu"),
        phase=dd(options=[("lúc nghỉ (rest)", "rest"), ("trong bước (step)", "step")],
                 value="step", description="Thời điểm"),
        shard_size=dd(options=(1, 2, 4, 8), value=8, description="shard_size (HYBRID)"),
        activation_gb=w.BoundedFloatText(0.0, min=0.0, max=10_000.0, step=1.0,
                                         description="Activation (GB)"),
        bucket_view=w.Checkbox(False, description="DDP: gradient_as_bucket_view=True"),
        strategies=w.SelectMultiple(options=STRATEGIES, value=DEFAULT_STRATEGIES, rows=4,
                                    description="Chiến lược"),
        presentation=w.Checkbox(False, description="Trình chiếu"),
    )


def measured_player(results: dict, world_size: int = 2, presentation: bool = False) -> Player:
    """One frame: ``measured_frame`` in the static player."""
    f = measured_frame(results, world_size)
    return Player([Frame(render.render(f), f.caption)], title=f.title, presentation=presentation)
