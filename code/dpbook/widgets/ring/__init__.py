"""The Ring AllReduce animation: ``frames`` (pure model), ``render`` (SVG), the static
``player`` and the live ``controls``.
"""

from __future__ import annotations

from ..player import Frame, Player
from . import render

# The public names of the frame model, at the package level (``render`` stays the module).
from .frames import (MAX_RANKS, RingFrame, ring_inputs, ring_frames, caption)

__all__ = ["player", "controls", "MAX_RANKS", "RingFrame", "ring_inputs", "ring_frames", "caption",
           "render"]


def player(world_size: int = 4, nbytes: float = 100e6, presentation: bool = False) -> Player:
    frames = [Frame(render.render(f), caption(f)) for f in ring_frames(world_size, nbytes)]
    return Player(frames, f"Ring AllReduce với {world_size} rank", presentation=presentation)


def controls():
    """Live controls (need a kernel): number of ranks, buffer size, presentation mode."""
    import ipywidgets as w

    from ..live import live

    return live(
        lambda world_size, megabytes, presentation: player(world_size, megabytes * 1e6,
                                                                presentation),
        world_size=w.IntSlider(value=4, min=2, max=MAX_RANKS, description="Số rank"),
        megabytes=w.FloatLogSlider(value=100, base=10, min=0, max=4, description="Bộ đệm (MB)"),
        presentation=w.Checkbox(value=False, description="Trình chiếu"),
    )
