"""One frame of the FSDP lifecycle as SVG: a row per unit, a column per rank, each shard's
state, the collective of the event and each rank's memory.
"""

from __future__ import annotations

import html
import itertools

from ...tracing.lifecycle import Trace, TraceEvent
from ...style import PALETTE, rank_colour
from ..svg import Svg
from .frames import LifecycleFrame, UnitView, fmt_bytes, kb, shard_position

# ---------------------------------------------------------------- drawing
_PHASES = {"rest": "Nghỉ", "forward": "Lượt xuôi", "backward": "Lượt ngược",
           "optimizer": "Bước tối ưu"}
_ACTIVITY = {  # label, colour of the cell's border
    "all_gather": ("AllGather", "blue"), "forward": ("tính lượt xuôi", "green"),
    "backward": ("tính gradient", "green"), "reduce_scatter": ("ReduceScatter", "vermillion"),
    "all_reduce": ("AllReduce", "purple"), "free": ("giải phóng", "grey"),
    "update": ("cập nhật", "black"),
}
_MEMORY = (("params", "tham số (shard)", "blue"), ("optimizer", "Adam", "grey"),
           ("grads", "gradient (shard)", "vermillion"), ("gathered", "tham số gom về", "yellow"),
           ("unreduced", "gradient chưa rút gọn", "purple"))
_GRID_X0, _GRID_X1, _MEM_X0, _MEM_X1 = 140.0, 700.0, 725.0, 990.0
_TOP, _ROW_H = 160.0, 72.0


def render(trace: Trace, frames: list[LifecycleFrame], i: int) -> str:
    """Frame ``i`` of ``frames`` as SVG: units x ranks, memory bars, phase timeline, legend."""
    f = frames[i]
    rows = len(trace.units)
    height = _TOP + rows * _ROW_H + 84
    svg = Svg(1000, height, f"Vòng đời shard FSDP, {trace.label}, bước {i + 1}/{len(frames)}")
    pos = [shard_position(trace, r) for r in range(trace.world_size)]
    _header(svg, trace, frames, i)
    _columns(svg, trace, f, pos)
    for k, unit in enumerate(trace.units):
        _unit_row(svg, trace, f, k, unit, pos)
    _memory_panel(svg, trace, frames, i, rows)
    _legend(svg, trace, _TOP + rows * _ROW_H + 14)
    return svg.render()


def _header(svg: Svg, trace: Trace, frames, i: int) -> None:
    f = frames[i]
    summary = html.escape(_summary(trace, f.event))
    svg.raw(f'<text x="10" y="24" class="t-big" text-anchor="start" dominant-baseline="middle" '
            f'fill="#111111"><tspan font-weight="bold">{_PHASES[f.phase]}</tspan>'
            f'{" · " + summary if summary else ""}</text>')
    # the step as a strip of phases, with a marker at this frame
    x0, x1, y = 10.0, 990.0, 60.0
    w = (x1 - x0) / len(frames)
    for j, g in enumerate(frames):
        fill = {"forward": PALETTE["sky"], "backward": PALETTE["orange"],
                "optimizer": PALETTE["green"]}.get(g.phase, PALETTE["light"])
        svg.rect(x0 + j * w, y, w, 12, fill=fill, stroke="#ffffff", cls="stroke", rx=0,
                 opacity=1.0 if j == i else 0.45)
    for phase in ("forward", "backward", "optimizer"):
        idx = [j for j, g in enumerate(frames) if g.phase == phase]
        if idx:
            svg.text(x0 + (idx[0] + idx[-1] + 1) / 2 * w, y + 26, _PHASES[phase], cls="t-small")
    svg.arrow(x0 + (i + 0.5) * w, y - 12, x0 + (i + 0.5) * w, y, colour=PALETTE["black"],
              head=8, cls="stroke")


def _summary(trace: Trace, e: TraceEvent) -> str:
    """The event in a few words, for the frame's heading."""
    name = trace.units[e.unit].name if e.unit is not None else ""
    if e.kind == "collective":
        return f"{_ACTIVITY[e.collective][0]} {name}, {fmt_bytes(e.nbytes)}"
    return {"forward_compute": f"{name} tính", "forward_post": f"{name} xong lượt xuôi",
            "backward_pre": f"{name} tính gradient", "backward_post": f"{name} xong gradient",
            "optimizer_begin": "optimizer.step()", "step_begin": "trước bước huấn luyện",
            "step_end": "sau bước huấn luyện"}.get(e.kind, "")


def _col_w(trace: Trace) -> float:
    return (_GRID_X1 - _GRID_X0) / trace.world_size


def _columns(svg: Svg, trace: Trace, f: LifecycleFrame, pos) -> None:
    cw, s = _col_w(trace), trace.shard_size
    for r in range(trace.world_size):
        cx = _GRID_X0 + (r + 0.5) * cw
        svg.text(cx, _TOP - 48, f"Rank {r}", cls="t", weight="bold")
        group, shard = pos[r]
        sub = "bản sao đầy đủ" if s == 1 else f"giữ shard {shard}"
        if s not in (1, trace.world_size):
            sub = f"nhóm {group}, shard {shard}"
        svg.text(cx, _TOP - 26, sub, cls="t-small")
    e = f.event
    if e.kind != "collective":
        return
    label, colour = _ACTIVITY[e.collective][0], PALETTE[_ACTIVITY[e.collective][1]]
    svg.text(12, _TOP - 6, label, cls="t-small", anchor="start", weight="bold", fill=colour)
    # groups that interleave (0-2 and 1-3) are drawn at two heights so they stay apart
    interleaved = any(b - a > 1 for g in f.groups for a, b in itertools.pairwise(g))
    for g, members in enumerate(f.groups):
        y = _TOP - 14 + 9 * (g % 2) * interleaved if interleaved else _TOP - 8
        xs = [_GRID_X0 + (r + 0.5) * cw for r in members]
        svg.line(xs[0], y, xs[-1], y, stroke=colour, cls="stroke arrow")
        for x in xs:
            svg.line(x, y, x, _TOP + 4, stroke=colour, cls="stroke arrow")


def _unit_row(svg: Svg, trace: Trace, f: LifecycleFrame, k: int, unit, pos) -> None:
    y0 = _TOP + k * _ROW_H
    if f.event.unit == k:
        svg.rect(4, y0 + 1, _GRID_X1 - 4, _ROW_H - 2, fill=PALETTE["light"], stroke="none",
                 cls="", rx=6)
    svg.text(12, y0 + 22, unit.name, cls="t", anchor="start", weight="bold")
    svg.text(12, y0 + 46, fmt_bytes(unit.param_bytes), cls="t-small", anchor="start")
    cw = _col_w(trace)
    for r, view in enumerate(f.ranks):
        _cell(svg, trace, view.units[k], pos[r][1], _GRID_X0 + r * cw + 8, y0, cw - 16)


def _dashed(svg: Svg, x, y, w, h) -> None:
    svg.raw(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="3" '
            f'fill="none" stroke="{PALETTE["grey"]}" stroke-dasharray="5 4" class="stroke"/>')


def _cell(svg: Svg, trace: Trace, v: UnitView, own: int, x: float, y0: float, w: float) -> None:
    s = trace.shard_size
    seg = w / s
    for j in range(s):  # parameters: one segment per shard of the unit
        if v.params == "full" or j == own:
            svg.rect(x + j * seg, y0 + 6, seg, 24, fill=rank_colour(j),
                     stroke="#111111" if j == own else PALETTE["grey"], rx=3)
        else:
            _dashed(svg, x + j * seg, y0 + 6, seg, 24)
    if v.grad == "full":
        svg.rect(x, y0 + 34, w, 9, fill=PALETTE["purple"], stroke="#333333", rx=2)
    elif v.grad == "reduced":
        svg.rect(x + own * seg, y0 + 34, seg, 9, fill=PALETTE["vermillion"], stroke="#333333",
                 rx=2)
    if v.activity is not None:
        label, colour = _ACTIVITY[v.activity]
        svg.rect(x - 4, y0 + 2, w + 8, _ROW_H - 6, fill="none", stroke=PALETTE[colour],
                 cls="stroke arrow", rx=6)
        svg.text(x + w / 2, y0 + 57, label, cls="t-small", weight="bold")
    else:
        svg.text(x + w / 2, y0 + 57, _idle_label(v, s), cls="t-small", fill="#333333")


def _idle_label(v: UnitView, s: int) -> str:
    if v.grad == "full":
        return "chờ rút gọn"
    if v.params == "shard":
        return f"shard 1/{s}"
    return "bản sao" if s == 1 else "đầy đủ"


def _memory_panel(svg: Svg, trace: Trace, frames, i: int, rows: int) -> None:
    n = trace.world_size
    top, bottom = _TOP + 16, _TOP + rows * _ROW_H - 22
    scale = max(v.memory.total for g in frames for v in g.ranks)
    svg.text((_MEM_X0 + _MEM_X1) / 2, _TOP - 48, "Bộ nhớ mỗi rank", cls="t", weight="bold")
    svg.text((_MEM_X0 + _MEM_X1) / 2, _TOP - 26, "kB, không tính activation",
             cls="t-small")
    slot = (_MEM_X1 - _MEM_X0) / n
    bw = min(60.0, slot - 16)
    for r, view in enumerate(frames[i].ranks):
        x = _MEM_X0 + r * slot + (slot - bw) / 2
        y = bottom
        for field, _, colour in _MEMORY:
            h = (bottom - top) * getattr(view.memory, field) / scale
            if h > 0:
                svg.rect(x, y - h, bw, h, fill=PALETTE[colour], stroke="#333333", rx=0)
                y -= h
        svg.text(x + bw / 2, y - 10, kb(view.memory.total), cls="t-small", weight="bold")
        svg.text(x + bw / 2, bottom + 13, f"rank {r}", cls="t-small")
        for level, dash in ((frames[0].ranks[r].memory.total, "6 4"),
                            (max(g.ranks[r].memory.total for g in frames), "2 3")):
            ly = bottom - (bottom - top) * level / scale
            svg.line(x - 6, ly, x + bw + 6, ly, stroke="#111111", cls="stroke", dash=dash)


def _legend_items(svg: Svg, x: float, y: float, items) -> None:
    """One legend row: (draw-swatch function, label) pairs, spaced for presentation-size text."""
    for swatch, label in items:
        swatch(x, y)
        svg.text(x + 26, y + 7, label, cls="t-small", anchor="start")
        x += 48 + 9.5 * len(label)


def _legend(svg: Svg, trace: Trace, y: float) -> None:
    def box(colour, h=14, dy=0):
        return lambda x, y: svg.rect(x, y + dy, 20, h, fill=colour, stroke="#333333", rx=2)

    def dash(pattern):
        return lambda x, y: svg.line(x, y + 7, x + 20, y + 7, stroke="#111111", cls="stroke",
                                     dash=pattern)

    s = trace.shard_size
    shards = [(box(rank_colour(j)), f"shard {j}") for j in range(s)] if s > 1 else \
        [(box(rank_colour(0)), "bản sao tham số")]
    if s > 1:
        shards.append((lambda x, y: _dashed(svg, x, y, 20, 14), "không có trên rank"))
    grads = [(box(PALETTE["purple"], 9, 3), "gradient đầy đủ, chưa rút gọn"),
             (box(PALETTE["vermillion"], 9, 3),
              "gradient đã rút gọn (phần của rank)" if s > 1 else "gradient sau AllReduce")]
    _legend_items(svg, 12, y, shards + grads[:1])
    _legend_items(svg, 12, y + 24, grads[1:] + [(dash("6 4"), "bộ nhớ lúc nghỉ"),
                                                (dash("2 3"), "đỉnh")])
    svg.text(12, y + 55, "Bộ nhớ:", cls="t-small", anchor="start", weight="bold")
    memory_items = [(box(PALETTE[c]), label if s > 1 else label.replace(" (shard)", ""))
                    for field, label, c in _MEMORY if s > 1 or field != "gathered"]
    _legend_items(svg, 100, y + 48, memory_items)
