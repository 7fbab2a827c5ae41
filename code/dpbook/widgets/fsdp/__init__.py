"""The FSDP shard lifecycle, replayed from a trace of a real run (``dpbook.tracing.lifecycle``):
``frames`` (pure model), ``render`` (SVG), the static ``player`` and the live ``controls``.
"""

from __future__ import annotations

from ...tracing.lifecycle import STRATEGIES, Trace, record_trace
from ...checks import one_of
from ..player import Frame, Player
from . import render

# The public names of the frame model, at the package level (``render`` stays the module).
from .frames import (ACTIVITIES, STATES, UnitView, MemoryBar, RankView, LifecycleFrame, memory_bar,
                     lifecycle_frames, fmt_bytes, kb, caption, shard_position)

__all__ = ["player_for", "player", "controls", "ACTIVITIES", "STATES", "UnitView", "MemoryBar",
           "RankView", "LifecycleFrame", "memory_bar", "lifecycle_frames", "fmt_bytes", "kb",
           "caption", "shard_position"]


def player_for(trace: Trace, presentation: bool = False) -> Player:
    """The static player of ``trace``'s lifecycle: every frame as inline SVG."""
    frames = lifecycle_frames(trace)
    return Player([Frame(render.render(trace, frames, i), f.caption) for i, f in enumerate(frames)],
                  title=f"Vòng đời shard FSDP: {trace.label}, {trace.world_size} rank, "
                        f"{trace.api}: {trace.wrapper} (trace ghi từ một bước chạy thật)",
                  presentation=presentation)


def player(strategy: str = "FULL_SHARD", traces: dict[str, Trace] | None = None,
           presentation: bool = False) -> Player:
    """The lifecycle of ``strategy``: drawn from ``traces[strategy]`` when recorded traces are
    given (``lifecycle.record_traces()``), else from a run recorded now (a few seconds)."""
    if traces is None:
        one_of("strategy", strategy, STRATEGIES)
        return player_for(record_trace(strategy), presentation)
    one_of("strategy", strategy, tuple(traces))
    return player_for(traces[strategy], presentation)


def controls(traces: dict[str, Trace]):
    """Live controls over already-recorded traces (``lifecycle.record_traces()``): a strategy menu
    and a presentation checkbox. Switching redraws from the trace; nothing is re-run."""
    import ipywidgets as w

    from ..live import live

    if not traces:
        raise ValueError("controls cần ít nhất một trace (dict rỗng); hãy gọi "
                         "dpbook.tracing.lifecycle.record_traces() trước.")

    def build(strategy: str, presentation: bool) -> Player:
        return player(strategy, traces, presentation)

    return live(build,
                strategy=w.Dropdown(options=list(traces), description="Chiến lược"),
                presentation=w.Checkbox(value=False, description="Trình chiếu"))
