"""The FSDP shard lifecycle, replayed from a trace recorded in a real run (``dpbook.trace``).

For every unit (each Block, and the root that owns the head) on every rank, the frames show
the parameters (a shard or the full tensor), the gradient (none, full and not yet reduced, or
reduced) and what is happening to the unit (AllGather, computing, ReduceScatter, freed...),
with a per-rank memory bar. Nothing here is scripted: ``lifecycle_frames`` replays the events
of the trace, one frame per collective and per other event that changes something.

How a trace event changes a unit (per rank):

* AllGather of unit k: its full parameters are now on the rank;
* forward pre-hook after FSDP's / backward pre-hook: the unit computes, once its parameters
  are full; the backward post-hook (or, for the first block, whose input needs no gradient,
  the first reduction after its backward began) ends the computation: a full gradient exists;
* ReduceScatter (AllReduce for NO_SHARD, and between replicas for HYBRID_SHARD): the
  gradient is reduced; the rank keeps its shard of it;
* freed: observed, not assumed: the unit's parameters were seen unsharded and now are sharded
  again (FSDP2 swaps sharded ``DTensor``s back in when it frees the full tensors).

The memory bar is ``memory.vram_ledger(..., phase="rest")`` (parameter and optimizer shards,
plus the gradient shard of each reduced unit) plus, from ``memory.bytes_per_param``, the full
parameter bytes of each gathered unit and the full gradient bytes of each unit computed but
not yet reduced. Activations and temporaries are left out on purpose: they are not state.
"""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass

from .. import memory
from ..checks import one_of
from ..trace import STRATEGIES, Trace, TraceEvent, record_trace
from .player import Frame, Player
from .svg import PALETTE, Svg, rank_colour

ACTIVITIES = (None, "all_gather", "forward", "backward", "reduce_scatter", "all_reduce", "free",
              "update")
# NO_SHARD units are always "gathered": every rank holds the full parameters (a replica).
STATES = ("sharded", "gathered", "computing", "reduce_scattered", "all_reduced", "freed",
          "updating")
_ALWAYS_SHOWN = ("step_begin", "collective", "optimizer_begin", "step_end")
_NEVER_SHOWN = ("optimizer_end",)
_REDUCTIONS = ("reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class UnitView:
    """One unit on one rank in one frame."""

    params: str  # "shard" or "full"
    grad: str | None  # None, "full" (computed, not reduced) or "reduced" (this rank's part)
    activity: str | None  # one of ACTIVITIES

    @property
    def state(self) -> str:
        """The lifecycle state, in the vocabulary of the chapter (one of ``STATES``)."""
        by_activity = {"forward": "computing", "backward": "computing",
                       "all_gather": "gathered", "reduce_scatter": "reduce_scattered",
                       "all_reduce": "all_reduced", "free": "freed", "update": "updating"}
        if self.activity in by_activity:
            return by_activity[self.activity]
        return "gathered" if self.params == "full" else "sharded"


@dataclass(frozen=True)
class MemoryBar:
    """Bytes of training state on one rank (see the module docstring)."""

    params: float  # this rank's parameter shards
    optimizer: float  # this rank's Adam state
    grads: float  # reduced gradient shards
    gathered: float  # full parameters of gathered units
    unreduced: float  # full gradients not yet reduced

    @property
    def total(self) -> float:
        return self.params + self.optimizer + self.grads + self.gathered + self.unreduced


@dataclass(frozen=True)
class RankView:
    rank: int
    units: tuple[UnitView, ...]
    memory: MemoryBar


@dataclass(frozen=True)
class LifecycleFrame:
    """The state of every rank right after ``event`` (rank 0's copy of it)."""

    event: TraceEvent
    ranks: tuple[RankView, ...]
    freed: tuple[int, ...]  # units whose full parameters were freed at this event
    caption: str
    groups: tuple[tuple[int, ...], ...] = ()  # collectives: the process groups, as recorded

    @property
    def phase(self) -> str:
        return self.event.phase


def _ledger(trace: Trace, num_params: int) -> memory.Ledger:
    hybrid = trace.strategy == "HYBRID_SHARD"
    return memory.vram_ledger(num_params, trace.world_size, trace.strategy, phase="rest",
                              shard_size=trace.shard_size if hybrid else None)


def memory_bar(trace: Trace, units: tuple[UnitView, ...]) -> MemoryBar:
    """The memory of one rank whose units look like ``units``."""
    p_bytes, g_bytes, _ = memory.bytes_per_param()
    rest = _ledger(trace, trace.num_params)
    gathered = unreduced = grads = 0.0
    for unit, view in zip(trace.units, units):
        if view.params == "full" and trace.shard_size > 1:  # the shard stays, the full copy adds
            gathered += p_bytes * unit.num_params
        if view.grad == "full":
            unreduced += g_bytes * unit.num_params
        elif view.grad == "reduced":
            grads += _ledger(trace, unit.num_params).grads
    return MemoryBar(rest.params, rest.optimizer, grads, gathered, unreduced)


class _Replay:
    """The per-unit state of one rank, advanced one trace event at a time."""

    def __init__(self, trace: Trace):
        n = len(trace.units)
        self.sharded = trace.shard_size > 1
        self.full = [not self.sharded] * n
        self.seen_full = [False] * n  # observed unsharded since its last AllGather
        self.fwd, self.bwd, self.bwd_done = [False] * n, [False] * n, [False] * n
        self.grad: list[str | None] = [None] * n
        events = trace.ranks[0].events
        self.last_in_backward = [e.unit for e in events if e.kind == "backward_pre"][-1]

    def step(self, e: TraceEvent) -> tuple[tuple[UnitView, ...], tuple[int, ...]]:
        activity: list[str | None] = [None] * len(self.full)
        freed = self._observe_frees(e, activity)
        k = e.unit
        if e.kind == "collective" and e.collective == "all_gather":
            self.full[k], activity[k] = True, "all_gather"
        elif e.kind == "collective" and e.collective in _REDUCTIONS:
            self.grad[k], self.bwd[k], activity[k] = "reduced", False, e.collective
            last = self.last_in_backward
            if self.bwd[last]:  # the first block has no informative post-hook: see docstring;
                self.bwd_done[last] = True  # no unit computes after it, so it is done by now
        elif e.kind in ("forward_compute", "forward_post"):
            self.fwd[k] = e.kind == "forward_compute"
        elif e.kind == "backward_pre":
            self.bwd[k] = True
        elif e.kind == "backward_post":
            self.bwd_done[k] = True
        elif e.kind == "optimizer_begin":
            activity = ["update"] * len(activity)
        return tuple(self._view(j, a) for j, a in enumerate(activity)), freed

    def _observe_frees(self, e: TraceEvent, activity: list) -> tuple[int, ...]:
        freed = []
        for j, unsharded in enumerate(e.unsharded if self.sharded else ()):
            if unsharded:
                self.seen_full[j] = True
            elif self.seen_full[j] and self.full[j]:
                self.full[j] = self.seen_full[j] = self.fwd[j] = False
                activity[j] = "free"
                freed.append(j)
        return tuple(freed)

    def _view(self, j: int, activity: str | None) -> UnitView:
        if activity is None and self.full[j]:
            if self.fwd[j]:
                activity = "forward"
            elif self.bwd[j] and not self.bwd_done[j]:
                activity = "backward"
        if activity == "backward" and self.grad[j] is None:
            self.grad[j] = "full"
        return UnitView("full" if self.full[j] else "shard", self.grad[j], activity)


def lifecycle_frames(trace: Trace) -> list[LifecycleFrame]:
    """One frame per collective, per other trace event that changes a unit or a memory bar, and
    for the step's start, the optimizer step and the end; every rank of ``trace`` in each."""
    replays = [_Replay(trace) for _ in trace.ranks]
    frames: list[LifecycleFrame] = []
    previous = None
    for i, e in enumerate(trace.ranks[0].events):
        views, freed = [], ()
        for rt, replay in zip(trace.ranks, replays):
            units, f = replay.step(rt.events[i])
            views.append(RankView(rt.rank, units, memory_bar(trace, units)))
            freed = freed or f
        state, key = tuple(views), _lasting(views)
        if e.kind in _NEVER_SHOWN or (e.kind not in _ALWAYS_SHOWN and key == previous):
            continue
        previous = key
        groups = tuple(sorted({rt.events[i].group_ranks for rt in trace.ranks} - {()}))
        frames.append(LifecycleFrame(e, state, freed, caption(trace, e, state, freed), groups))
    return frames


def _lasting(views: list[RankView]) -> tuple:
    """What a frame shows beyond its event: an AllGather or a free seen in the previous frame
    is not a change by itself (else every hook after a collective would make a frame)."""
    return tuple((u.params, u.grad, u.activity if u.activity in ("forward", "backward") else None)
                 for v in views for u in v.units)


def fmt_bytes(b: float) -> str:
    """``22304`` -> ``"22 304 B"`` (a space groups thousands, as in the book's prose)."""
    return f"{b:,.0f} B".replace(",", " ")


def _kb(b: float) -> str:
    """Bytes in kB with a decimal comma, without the unit (the panel's heading names it)."""
    return f"{b / 1000:.1f}".replace(".", ",")


def _why_kept(trace: Trace) -> str:
    if trace.strategy == "SHARD_GRAD_OP":
        return "reshard_after_forward=False"
    return "root: reshard_after_forward=None, mặc định của PyTorch, không reshard root"


def _event_sentence(trace: Trace, e: TraceEvent, state, freed) -> str:
    """What the event itself did, in one Vietnamese sentence."""
    s, name = trace.shard_size, (trace.units[e.unit].name if e.unit is not None else "")
    if e.kind == "step_begin":
        if s == 1:
            return ("Trạng thái nghỉ (NO_SHARD): mỗi rank giữ bản sao đầy đủ tham số và trạng thái "
                    f"Adam của mọi unit: {fmt_bytes(state[0].memory.total)}.")
        return (f"Trạng thái nghỉ: mỗi rank chỉ giữ shard của mình, 1/{s} tham số và 1/{s} trạng "
                f"thái Adam của mỗi unit: {fmt_bytes(state[0].memory.total)}.")
    if e.kind == "collective":
        return _collective_sentence(trace, e, name, state, freed)
    if e.kind == "forward_compute":
        return f"{name} tính lượt xuôi với tham số đầy đủ."
    if e.kind == "forward_post":
        if e.unit in freed:
            return f"{name} xong lượt xuôi và giải phóng tham số đầy đủ: chỉ còn shard."
        if s > 1:
            return (f"{name} xong lượt xuôi nhưng giữ tham số đầy đủ ({_why_kept(trace)}):"
                    " lượt ngược không phải AllGather lại.")
        return f"{name} xong lượt xuôi (tham số luôn đầy đủ)."
    if e.kind == "backward_pre":
        return f"Lượt ngược tới {name}: tính gradient với tham số đầy đủ."
    if e.kind == "backward_post":
        return f"{name} tính xong gradient đầy đủ; gradient mỗi rank còn khác nhau, chưa đồng bộ."
    if e.kind == "optimizer_begin":
        if s == 1:
            return "optimizer.step(): mỗi rank tự cập nhật toàn bộ bản sao, không cần giao tiếp."
        return ("optimizer.step(): mỗi rank chỉ cập nhật shard tham số của mình, bằng shard "
                "gradient và shard trạng thái Adam của chính nó; không cần giao tiếp.")
    if e.kind == "step_end":
        return (f"Hết một bước: trở lại trạng thái nghỉ, mỗi rank giữ "
                f"{fmt_bytes(state[0].memory.total)} (tham số, gradient, trạng thái Adam).")
    return "Hết lượt ngược." if e.kind == "backward_end" else ""


def _collective_sentence(trace: Trace, e: TraceEvent, name: str, state, freed) -> str:
    s, b = trace.shard_size, fmt_bytes(e.nbytes)
    if e.collective == "all_gather":
        text = (f"AllGather {name} ({b}): mỗi rank góp shard {fmt_bytes(e.nbytes / s)} của mình và "
                "nhận các shard còn lại, đủ tham số của unit.")
        if e.phase == "backward":
            text = f"Lượt ngược cần lại tham số đã giải phóng: {text}"
            if any(v.params == "full" for j, v in enumerate(state[0].units) if j != e.unit):
                text += " FSDP2 gom trước (prefetch) khi unit trước nó còn giữ tham số để tính."
        elif e.unit == len(trace.units) - 1:
            text += " Root được gom trước mọi block: pre-forward của root chạy đầu tiên."
        return text
    if e.collective == "reduce_scatter":
        return (f"ReduceScatter gradient {name} ({b}): cộng gradient của {e.group_size} rank, mỗi "
                f"rank giữ 1/{s} tổng ({fmt_bytes(e.nbytes / s)}); gradient đầy đủ"
                + (" và tham số đầy đủ" if e.unit in freed else "") + " được giải phóng.")
    if s == 1:
        return (f"AllReduce gradient {name} ({b}): mọi rank nhận tổng đầy đủ, như DDP nhưng theo "
                "từng unit.")
    return (f"AllReduce shard gradient {name} ({b}) giữa {e.group_size} bản sao: các rank giữ cùng "
            "shard ở các nhóm khác nhau cộng gradient với nhau.")


def caption(trace: Trace, e: TraceEvent, state, freed) -> str:
    """The frame's caption: the event, then any unit freed as a side effect."""
    text = _event_sentence(trace, e, state, freed)
    others = [trace.units[k].name for k in freed
              if k != e.unit or e.kind not in ("forward_post", "collective")]
    if others:
        text += f" {' và '.join(others)} giải phóng tham số đầy đủ."
    return text.strip()


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
           ("unreduced", "gradient chưa reduce", "purple"))
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


def shard_position(trace: Trace, rank: int) -> tuple[int, int]:
    """(shard group, shard index) of ``rank``, read from the groups its AllGathers used."""
    groups = sorted({e.group_ranks for rt in trace.ranks for e in rt.events
                     if e.collective == "all_gather" and e.group_ranks})
    for g, members in enumerate(groups):
        if rank in members:
            return g, members.index(rank)
    return 0, 0  # NO_SHARD: no AllGather, every rank holds the whole unit


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
        return "chờ reduce"
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
        svg.text(x + bw / 2, y - 10, _kb(view.memory.total), cls="t-small", weight="bold")
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
    grads = [(box(PALETTE["purple"], 9, 3), "gradient đầy đủ, chưa reduce"),
             (box(PALETTE["vermillion"], 9, 3),
              "gradient đã reduce (phần của rank)" if s > 1 else "gradient đã AllReduce")]
    _legend_items(svg, 12, y, shards + grads[:1])
    _legend_items(svg, 12, y + 24, grads[1:] + [(dash("6 4"), "bộ nhớ lúc nghỉ"),
                                                (dash("2 3"), "đỉnh")])
    svg.text(12, y + 55, "Bộ nhớ:", cls="t-small", anchor="start", weight="bold")
    memory_items = [(box(PALETTE[c]), label if s > 1 else label.replace(" (shard)", ""))
                    for field, label, c in _MEMORY if s > 1 or field != "gathered"]
    _legend_items(svg, 100, y + 48, memory_items)


def fsdp_player(trace: Trace, presentation: bool = False) -> Player:
    """The static player of ``trace``'s lifecycle: every frame as inline SVG."""
    frames = lifecycle_frames(trace)
    return Player([Frame(render(trace, frames, i), f.caption) for i, f in enumerate(frames)],
                  title=f"Vòng đời shard FSDP: {trace.label}, {trace.world_size} rank, "
                        f"{trace.api}: {trace.wrapper} (trace ghi từ một bước chạy thật)",
                  presentation=presentation)


def player(strategy: str = "FULL_SHARD", traces: dict[str, Trace] | None = None,
           presentation: bool = False) -> Player:
    """The lifecycle of ``strategy``: drawn from ``traces[strategy]`` when recorded traces are
    given (``trace.record_traces()``), else from a run recorded now (a few seconds)."""
    if traces is None:
        one_of("strategy", strategy, STRATEGIES)
        return fsdp_player(record_trace(strategy), presentation)
    one_of("strategy", strategy, tuple(traces))
    return fsdp_player(traces[strategy], presentation)


def controls(traces: dict[str, Trace]):
    """Live controls over already-recorded traces (``trace.record_traces()``): a strategy menu
    and a presentation checkbox. Switching redraws from the trace; nothing is re-run."""
    import ipywidgets as w

    from .live import live

    if not traces:
        raise ValueError("controls cần ít nhất một trace (dict rỗng); hãy gọi "
                         "dpbook.trace.record_traces() trước.")

    def build(strategy: str, presentation: bool) -> Player:
        return player(strategy, traces, presentation)

    return live(build,
                strategy=w.Dropdown(options=list(traces), description="Chiến lược"),
                presentation=w.Checkbox(value=False, description="Trình chiếu"))
