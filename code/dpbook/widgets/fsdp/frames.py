"""The FSDP shard lifecycle, replayed from a trace recorded in a real run
(``dpbook.tracing.lifecycle``).

For every unit (each Block, and the root that owns the head) on every rank, the frames show
the parameters (a shard or the full tensor), the gradient (none, full and not yet reduced, or
reduced) and what is happening to the unit (AllGather, computing, ReduceScatter, freed...),
with a per-rank memory bar. Nothing here is scripted: ``lifecycle_frames`` replays the events
of the trace, one frame per collective and per other event that changes something. This is
the widget's pure frame model (data only); ``widgets.fsdp`` draws it.

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
not yet reduced. Activations and temporaries are left out on purpose: they are not state."""

from __future__ import annotations

from dataclasses import dataclass

from ... import memory, vi
from ...tracing.lifecycle import Trace, TraceEvent

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
    """``22304`` -> ``"22\u202f304 B"``: thousands grouped by the book's narrow no-break space,
    one character, so the renderer's width estimate (by characters) still holds."""
    return vi.grouped(b, vi.NARROW_NBSP) + " B"


def kb(b: float) -> str:
    """Bytes in kB with a decimal comma, without the unit (the panel's heading names it)."""
    return vi.number(b / 1000, 1)


def _why_kept(trace: Trace) -> str:
    if trace.strategy == "SHARD_GRAD_OP":
        return "reshard_after_forward=False"
    return "reshard_after_forward=None, mặc định của PyTorch: root không chia mảnh lại"


def _event_sentence(trace: Trace, e: TraceEvent, state, freed) -> str:
    """What the event itself did, in one Vietnamese sentence."""
    s, name = trace.shard_size, (trace.units[e.unit].name if e.unit is not None else "")
    if e.kind == "step_begin":
        if s == 1:
            return ("Trạng thái nghỉ (NO_SHARD): mỗi rank giữ bản sao đầy đủ tham số và trạng thái "
                    f"Adam của mọi đơn vị: {fmt_bytes(state[0].memory.total)}.")
        return (f"Trạng thái nghỉ: mỗi rank chỉ giữ shard của mình, 1/{s} tham số và 1/{s} trạng "
                f"thái Adam của mỗi đơn vị: {fmt_bytes(state[0].memory.total)}.")
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
                "nhận các shard còn lại, đủ tham số của đơn vị.")
        if e.phase == "backward":
            text = f"Lượt ngược cần lại tham số đã giải phóng: {text}"
            if any(v.params == "full" for j, v in enumerate(state[0].units) if j != e.unit):
                text += (" FSDP2 gom trước (prefetch) khi đơn vị trước nó còn giữ tham số để "
                         "tính.")
        elif e.unit == len(trace.units) - 1:
            text += " Root được gom trước mọi block: pre-forward của root chạy đầu tiên."
        return text
    if e.collective == "reduce_scatter":
        return (f"ReduceScatter gradient {name} ({b}): cộng gradient của {e.group_size} rank, mỗi "
                f"rank giữ 1/{s} tổng ({fmt_bytes(e.nbytes / s)}); gradient đầy đủ"
                + (" và tham số đầy đủ" if e.unit in freed else "") + " được giải phóng.")
    if s == 1:
        return (f"AllReduce gradient {name} ({b}): mọi rank nhận tổng đầy đủ, như DDP nhưng theo "
                "từng đơn vị.")
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


def shard_position(trace: Trace, rank: int) -> tuple[int, int]:
    """(shard group, shard index) of ``rank``, read from the groups its AllGathers used."""
    groups = sorted({e.group_ranks for rt in trace.ranks for e in rt.events
                     if e.collective == "all_gather" and e.group_ranks})
    for g, members in enumerate(groups):
        if rank in members:
            return g, members.index(rank)
    return 0, 0  # NO_SHARD: no AllGather, every rank holds the whole unit
