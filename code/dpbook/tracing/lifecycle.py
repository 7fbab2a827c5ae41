"""Record what FSDP really does in one training step: hook events and collectives, in order.

A trace is the measurement behind the FSDP lifecycle animation (``widgets.fsdp``): the widget
draws what happened in a real run instead of a hand-written schedule.

How it is recorded (``record_lifecycle``, a rank function for ``launch.spawn``):

* the model is ``models.build_mlp`` (``depth`` Blocks and a head that the root module owns),
  wrapped by ``train.apply_fsdp2`` (FSDP2) or, for NO_SHARD which FSDP2 cannot express, by
  ``train.apply_fsdp(model, "NO_SHARD")`` (FSDP1);
* module hooks mark each unit's forward (pre-hook before FSDP's own, so it precedes the
  AllGather; a second pre-hook after FSDP's, when computation starts; a post-hook after FSDP's,
  when the unit may have been resharded) and backward (``register_full_backward_pre_hook``: the
  gradient of the unit's output has arrived; ``register_full_backward_hook``: the gradient of
  its input is computed. The latter carries no information when no input needs a gradient, as
  for the first block, whose input is the data: such calls are not recorded);
* ``TraceLog``, a ``measure.CommLog`` that also writes hook events into the same list, sees
  every c10d collective with its bytes and group size, so hooks and collectives share one order;
* at every event the log looks at each unit's parameters: FSDP2 swaps a module's parameters
  between sharded ``DTensor``s and plain unsharded tensors, so "is it a DTensor now?" observes
  when a unit's full parameters are freed.

Which unit a collective belongs to (``assign_units``): the unit whose parameter bytes equal the
collective's bytes (AllGather output, ReduceScatter input; for an AllReduce of gradient shards
between replicas, a shard: bytes / shard size). Units of equal size (identical blocks) are told
apart by order: FSDP issues their collectives in the order the units run in that pass, which is
the order of their forward pre-hooks (forward) or backward pre-hooks (backward). Order alone
would not do: FSDP2 prefetches the next unit's AllGather during backward, and reduce-scatters
the first block and the root only at the end of backward.

Strategies: FSDP2 has no ``sharding_strategy``; the chapter's names map to ``apply_fsdp2`` as
FULL_SHARD = ``reshard_after_forward=True``, passed explicitly so that the root is resharded too
(``reshard_root=False`` records PyTorch's default ``None`` instead, which keeps the root
unsharded between forward and backward); SHARD_GRAD_OP = ``False``; HYBRID_SHARD =
``shard_size=2`` on 4 ranks (a 2 x 2 mesh), resharding like FULL_SHARD. NO_SHARD is FSDP1.

Prefetching (``prefetch=k``, section 4.2.7): FSDP2's explicit prefetch, set by ``set_prefetch``
on the Blocks in forward order: each Block asks for the AllGathers of the next ``k`` Blocks
(``set_modules_to_forward_prefetch``) right after its own, and in backward for the previous
``k`` (``set_modules_to_backward_prefetch``). ``prefetch=0`` (the default) leaves FSDP2's implicit
prefetching alone: forward issues a unit's AllGather in that unit's own pre-forward hook, backward
prefetches one unit in reverse post-forward order (``FSDPParamGroup._backward_prefetch``).

The step recorded is the second one (Adam creates its state in the first), after
``zero_grad(set_to_none=True)``: a rank starts it with parameters and optimizer state only, and
``measure.state_bytes`` is taken before and after it, so the widget's memory bar can be checked
against what the rank really held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..checks import int_at_least, one_of
from ..measure import CommLog, StateBytes

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
HOOK_KINDS = ("forward_pre", "forward_compute", "forward_post", "backward_pre", "backward_post")
MARKS = ("step_begin", "backward_begin", "backward_end", "optimizer_begin", "optimizer_end",
         "step_end")
MAX_DEPTH = 6


@dataclass(frozen=True)
class Unit:
    """One FSDP unit: a Block, or the root module with the parameters no Block owns (the head)."""

    name: str
    num_params: int
    param_bytes: int


@dataclass(frozen=True)
class TraceEvent:
    """A hook, a collective or a step marker, in the order it happened on one rank."""

    index: int
    kind: str  # one of HOOK_KINDS, MARKS, or "collective"
    phase: str  # "rest", "forward", "backward", "optimizer"
    unit: int | None = None  # index into Trace.units (collectives: set by assign_units)
    collective: str | None = None  # all_gather, reduce_scatter, all_reduce, ...
    nbytes: int = 0  # full tensor bytes, as measure.CommRecord counts them
    group_size: int = 1
    unsharded: tuple[bool, ...] = ()  # per unit: its parameters are full tensors right now
    group_ranks: tuple[int, ...] = ()  # collectives: the global ranks of the process group


@dataclass(frozen=True)
class RankTrace:
    """One rank's events and its state bytes (``measure.state_bytes``) before and after."""

    rank: int
    events: tuple[TraceEvent, ...]
    state_before: StateBytes  # after zero_grad(set_to_none=True): parameters + optimizer
    state_after: StateBytes  # right after optimizer.step(): with gradients


@dataclass(frozen=True)
class Trace:
    """What every rank did in one step, and how the model was wrapped."""

    strategy: str
    reshard_root: bool
    wrapper: str  # the call that wrapped the model, as the reader would write it
    api: str  # "FSDP2" (fully_shard) or "FSDP1" (FullyShardedDataParallel, for NO_SHARD)
    world_size: int
    shard_size: int  # ranks that share one unit's shards (1: NO_SHARD)
    units: tuple[Unit, ...]
    ranks: tuple[RankTrace, ...]
    prefetch: int = 0  # explicit FSDP2 prefetch depth (``set_prefetch``); 0: PyTorch's implicit

    @property
    def num_params(self) -> int:
        return sum(u.num_params for u in self.units)

    @property
    def label(self) -> str:
        label = self.strategy
        if not self.reshard_root:
            label += " (mặc định PyTorch: root không chia mảnh lại)"
        if self.prefetch:
            label += f", gom trước tường minh {self.prefetch} đơn vị"
        return label


class TraceLog(CommLog):
    """A ``CommLog`` that also keeps hook events, so hooks and collectives share one order.

    ``observe()`` returns, per unit, whether its parameters are unsharded right now; it is
    called at every event. ``records`` keeps ``CommLog``'s behaviour unchanged."""

    def __init__(self, observe: Callable[[], tuple[bool, ...]] = tuple) -> None:
        super().__init__()
        self.events: list[TraceEvent] = []
        self.phase = "rest"
        self._observe = observe
        self._active = False

    def __enter__(self):
        self._active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self._active = False
        return super().__exit__(*exc)

    def mark(self, kind: str, unit: int | None = None) -> None:
        """Record a hook or a marker; returns ``None`` so hooks never replace values. Hooks stay
        registered after the ``with`` block (warm-up steps too): calls outside it are ignored."""
        if not self._active:
            return
        self.phase = {"backward_begin": "backward", "optimizer_begin": "optimizer",
                      "step_end": "rest"}.get(kind, self.phase)
        self.events.append(TraceEvent(len(self.events), kind, self.phase, unit,
                                      unsharded=self._observe()))
        if kind == "step_begin":  # the first event shows the state at rest, then forward runs
            self.phase = "forward"

    def _record(self, func, args, kwargs) -> None:
        before = len(self.records)
        super()._record(func, args, kwargs)
        if len(self.records) > before:
            r = self.records[-1]
            self.events.append(TraceEvent(len(self.events), "collective", self.phase, None,
                                          r.collective, r.nbytes, r.group_size,
                                          self._observe(), _group_ranks(func, args, kwargs)))


def _group_ranks(func, args, kwargs) -> tuple[int, ...]:
    """Which ranks took part: HYBRID_SHARD's groups are the point of its picture."""
    import torch.distributed as dist

    bound = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
    group = dist.ProcessGroup.unbox(bound["process_group"])
    try:
        return tuple(dist.get_process_group_ranks(group))
    except (KeyError, RuntimeError, ValueError):  # a group torch does not list: say nothing
        return ()


def _wrap(model, strategy: str, reshard_root: bool):
    """Wrap as the strategy says; returns (wrapped model, the call as text, shard size)."""
    from torch.distributed import get_world_size

    from ..train import apply_fsdp, apply_fsdp2

    if strategy == "NO_SHARD":
        # FSDP2 has no NO_SHARD: a 1-rank shard mesh would still AllGather. FSDP1 keeps it.
        return apply_fsdp(model, "NO_SHARD"), 'apply_fsdp(model, "NO_SHARD")', 1
    raf = False if strategy == "SHARD_GRAD_OP" else (True if reshard_root else None)
    shard = 2 if strategy == "HYBRID_SHARD" else None
    call = f"apply_fsdp2(model, reshard_after_forward={raf}"
    call += f", shard_size={shard})" if shard else ")"
    return apply_fsdp2(model, reshard_after_forward=raf, shard_size=shard), call, \
        shard or get_world_size()


def set_prefetch(blocks, forward: int = 0, backward: int = 0) -> None:
    """Explicit FSDP2 prefetching over ``blocks``, ``fully_shard`` units in forward order:
    Block ``i`` prefetches Blocks ``i+1 … i+forward`` in forward and Blocks ``i-1 … i-backward``
    in backward, fewer at the ends (the recipe of ``distributed/FSDP2/example.py`` in
    pytorch/examples, which instead leaves the Blocks without ``forward`` successors at the
    default). ``0`` keeps PyTorch's implicit prefetching in that direction."""
    from torch.distributed.fsdp import FSDPModule

    int_at_least("forward", forward, 0)
    int_at_least("backward", backward, 0)
    blocks = list(blocks)
    if not all(isinstance(b, FSDPModule) for b in blocks):
        raise ValueError("set_prefetch cần các module đã qua fully_shard (FSDP2), theo thứ tự "
                         "lượt xuôi.")
    for i, block in enumerate(blocks):
        ahead = blocks[i + 1:i + 1 + forward]
        if ahead:
            block.set_modules_to_forward_prefetch(ahead)
        behind = blocks[max(0, i - backward):i][::-1]
        if behind:
            block.set_modules_to_backward_prefetch(behind)


def _units(model) -> tuple[list[Unit], list, list]:
    """Units of the unwrapped MLP: (units, the Blocks, the modules that compute with each
    unit's own parameters: the Blocks, then the head for the root)."""
    units, modules, compute = [], [], []
    for k, block in enumerate(model.blocks):
        n = sum(p.numel() for p in block.parameters())
        units.append(Unit(f"Block {k}", n, 4 * n))
        modules.append(block)
        compute.append(block)
    n = sum(p.numel() for p in model.head.parameters())
    units.append(Unit("Root (head)", n, 4 * n))
    return units, modules, compute + [model.head]


def _register_hooks(log: TraceLog, modules, compute) -> None:
    for k, (mod, comp) in enumerate(zip(modules, compute)):
        # prepend: before FSDP's pre-forward, hence before the unit's AllGather
        mod.register_forward_pre_hook(lambda *_, k=k: log.mark("forward_pre", k), prepend=True)
        comp.register_forward_pre_hook(lambda *_, k=k: log.mark("forward_compute", k))
        # appended: after FSDP's post-forward, which may have resharded the unit
        mod.register_forward_hook(lambda *_, k=k: log.mark("forward_post", k))
        comp.register_full_backward_pre_hook(lambda *_, k=k: log.mark("backward_pre", k))
        comp.register_full_backward_hook(
            lambda _m, grad_in, _o, k=k: log.mark("backward_post", k)
            if any(g is not None for g in grad_in) else None)


def record_lifecycle(rank: int, world_size: int, strategy: str = "FULL_SHARD",
                     reshard_root: bool = True, depth: int = 3, batch_size: int = 4,
                     prefetch: int = 0) -> dict:
    """Rank function for ``launch.spawn``: wrap a small MLP, take one warm-up step (Adam creates
    its state), then record one step: forward, backward, ``optimizer.step()``. ``prefetch``:
    explicit FSDP2 prefetch depth in both directions (``set_prefetch``); 0: implicit."""
    from torch.distributed.tensor import DTensor

    from ..data import rank_batch, synthetic_regression
    from ..launch import device
    from ..measure import state_bytes
    from ..models import build_mlp
    from ..train import train_step

    one_of("strategy", strategy, STRATEGIES)
    _check_prefetch(strategy, prefetch)
    model = build_mlp(depth=depth)
    units, modules, compute = _units(model)
    # Look parameters up again at every event: FSDP2 swaps the module's parameter objects.
    probes = [(m.linear if k < len(units) - 1 else m) for k, m in enumerate(compute)]
    wrapped, call, shard = _wrap(model, strategy, reshard_root)
    if prefetch:
        set_prefetch(model.blocks, prefetch, prefetch)
        call += f"; set_prefetch(model.blocks, {prefetch}, {prefetch})"
    if strategy == "NO_SHARD":  # FSDP1 flat parameters: nothing is ever sharded
        log = TraceLog(lambda: (True,) * len(units))
    else:
        log = TraceLog(lambda: tuple(not isinstance(m.weight, DTensor) for m in probes))
    _register_hooks(log, modules + [wrapped], compute)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    ds = synthetic_regression(batch_size * world_size, 16, 4)
    x, y = rank_batch(ds.tensors, rank, batch_size, device())
    train_step(wrapped, optimizer, x, y)
    before = state_bytes(wrapped, optimizer)
    with log:
        log.mark("step_begin")
        loss = torch.nn.functional.mse_loss(wrapped(x), y)
        log.mark("backward_begin")
        loss.backward()
        log.mark("backward_end")
        log.mark("optimizer_begin")
        optimizer.step()
        log.mark("optimizer_end")
        after = state_bytes(wrapped, optimizer)
        log.mark("step_end")
    return {"units": units, "events": log.events, "before": before, "after": after,
            "call": call, "shard_size": shard, "prefetch": prefetch}


def _check_prefetch(strategy: str, prefetch) -> None:
    int_at_least("prefetch", prefetch, 0)
    if prefetch and strategy == "NO_SHARD":
        raise ValueError("prefetch chỉ dùng được với FSDP2; NO_SHARD ở đây là FSDP1 "
                         "(FullyShardedDataParallel). Hãy để prefetch=0.")


def assign_units(events, units, shard_size: int) -> tuple[TraceEvent, ...]:
    """Give every collective the unit it serves (see the module docstring for the rule)."""
    order = {p: [e.unit for e in events if e.kind == kind]
             for p, kind in (("forward", "forward_pre"), ("backward", "backward_pre"))}
    served: dict[tuple[str, str], set[int]] = {}
    out = []
    for e in events:
        if e.kind == "collective":
            expected = [u.param_bytes // (shard_size if e.collective == "all_reduce" else 1)
                        for u in units]
            done = served.setdefault((e.collective, e.phase), set())
            match = [k for k in order.get(e.phase, []) if expected[k] == e.nbytes and k not in done]
            if not match:
                raise ValueError(
                    f"Không gán được {e.collective} {e.nbytes} B (sự kiện {e.index}, lượt "
                    f"{e.phase}) cho đơn vị nào: kích thước các đơn vị là {expected} B.")
            done.add(match[0])
            e = replace(e, unit=match[0])
        out.append(e)
    return tuple(out)


def world_size_for(strategy: str) -> int:
    """2 ranks, or 4 for HYBRID_SHARD (a 2 x 2 mesh: 2 replicas of a 2-rank shard group)."""
    one_of("strategy", strategy, STRATEGIES)
    return 4 if strategy == "HYBRID_SHARD" else 2


def record_trace(strategy: str = "FULL_SHARD", *, reshard_root: bool = True, depth: int = 3,
                 timeout: float = 180.0, prefetch: int = 0) -> Trace:
    """Run one real step on CPU (gloo) with ``strategy`` and return its trace.

    ``reshard_root``: with FULL_SHARD or HYBRID_SHARD, ``True`` passes
    ``reshard_after_forward=True`` (the root is resharded too, as in the textbook ZeRO-3);
    ``False`` passes PyTorch's default ``None``, which keeps the root unsharded after forward.
    ``prefetch``: explicit FSDP2 prefetch depth (``set_prefetch``), 0 for PyTorch's implicit.
    """
    from ..launch import spawn

    n = world_size_for(strategy)
    int_at_least("depth", depth)
    if depth > MAX_DEPTH:
        raise ValueError(f"depth tối đa là {MAX_DEPTH} để hình còn đọc được, nhận được {depth}.")
    if not isinstance(reshard_root, bool):  # the book's convention: bad inputs -> ValueError
        raise ValueError(  # noqa: TRY004
            f"reshard_root phải là True hoặc False, nhận được {reshard_root!r}.")
    _check_prefetch(strategy, prefetch)
    results = spawn(record_lifecycle, strategy, reshard_root, depth, world_size=n,
                    backend="gloo", timeout=timeout, output="none", prefetch=prefetch)
    return trace_from_results(strategy, reshard_root, results)


def trace_from_results(strategy: str, reshard_root: bool, results: list[dict]) -> Trace:
    """The ``Trace`` of what every rank's ``record_lifecycle`` returned (in rank order): a page
    that calls ``record_lifecycle`` inside a launch of its own builds its traces with this."""
    one_of("strategy", strategy, STRATEGIES)
    if not results:
        raise ValueError("Cần kết quả của ít nhất một rank (danh sách rỗng).")
    n = len(results)
    r0 = results[0]
    units = tuple(r0["units"])
    ranks = tuple(RankTrace(r, assign_units(res["events"], units, r0["shard_size"]),
                            res["before"], res["after"]) for r, res in enumerate(results))
    shape = [(e.kind, e.unit, e.collective, e.nbytes) for e in ranks[0].events]
    if any([(e.kind, e.unit, e.collective, e.nbytes) for e in rt.events] != shape
           for rt in ranks):
        raise RuntimeError("Các rank ghi được chuỗi sự kiện khác nhau; trace không nhất quán.")
    return Trace(strategy, reshard_root if strategy in ("FULL_SHARD", "HYBRID_SHARD") else True,
                 r0["call"], "FSDP1" if strategy == "NO_SHARD" else "FSDP2", n,
                 r0["shard_size"], units, ranks, r0.get("prefetch", 0))


def record_traces(strategies=STRATEGIES, *, pytorch_default_root: bool = True,
                  depth: int = 3) -> dict[str, Trace]:
    """Record one trace per strategy (plus FULL_SHARD with PyTorch's default root behaviour),
    keyed by ``Trace.label``."""
    traces = [record_trace(s, depth=depth) for s in strategies]
    if pytorch_default_root:
        traces.append(record_trace("FULL_SHARD", reshard_root=False, depth=depth))
    return {t.label: t for t in traces}
