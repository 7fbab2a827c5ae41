"""DataParallel against DDP, one training step: ``frames`` (pure model), ``render`` (SVG),
the static ``player`` and the live ``controls``.
"""

from __future__ import annotations

from ... import vi
from ..player import Frame, Player
from . import render

# The public names of the frame model, at the package level (``render`` stays the module).
from .frames import (HOST, KINDS, MAX_GPUS, RESNET50_BYTES, BATCH_BYTES, OUTPUT_BYTES, STATES, Transfer,
                     Side, Step, traffic_totals, iteration_steps)
from .render import STATE_FILL, STATE_LABEL

__all__ = ["player", "controls", "HOST", "KINDS", "MAX_GPUS", "RESNET50_BYTES", "BATCH_BYTES",
           "OUTPUT_BYTES", "STATES", "Transfer", "Side", "Step", "traffic_totals",
           "iteration_steps", "STATE_FILL", "STATE_LABEL"]


def player(world_size: int = 4, *, presentation: bool = False, **sizes) -> Player:
    """The static player over ``iteration_steps(world_size, **sizes)``."""
    steps = iteration_steps(world_size, **sizes)
    top = max(max(s.dp.traffic + s.ddp.traffic) for s in steps)
    frames = [Frame(render.render(s, i, len(steps), top), f"{s.phase}. {s.caption} Qua GPU 0 đến giờ: "
                    f"DP {vi.nbytes(s.dp.traffic[0])}, DDP {vi.nbytes(s.ddp.traffic[0])}.")
              for i, s in enumerate(steps)]
    return Player(frames, title=f"DP và DDP: một bước huấn luyện trên {world_size} GPU",
                  presentation=presentation, interval_ms=2200)


def controls(world_size: int = 4):
    """Live ipywidgets (need a kernel): N, buckets, model/batch/output sizes in MB."""
    import ipywidgets as w

    from ..live import live

    def build(model_mb, input_mb, output_mb, **values):
        return player(model_bytes=model_mb * 1e6, input_bytes=input_mb * 1e6,
                                output_bytes=output_mb * 1e6, **values)

    style = {"description_width": "initial"}
    mb = lambda v, d: w.BoundedFloatText(v / 1e6, min=0.0, max=1e6, step=1.0,  # noqa: E731
                                          description=d, style=style)
    return live(
        build,
        world_size=w.IntSlider(world_size, min=2, max=MAX_GPUS, description="Số GPU N",
                               style=style),
        buckets=w.IntSlider(3, min=1, max=6, description="Số bucket (DDP)", style=style),
        model_mb=mb(RESNET50_BYTES, "Mô hình (MB)"),
        input_mb=mb(BATCH_BYTES, "Batch (MB)"),
        output_mb=mb(OUTPUT_BYTES, "Đầu ra (MB)"),
        presentation=w.Checkbox(False, description="Trình chiếu"),
    )
