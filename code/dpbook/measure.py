"""Measure in a real run what ``costs`` and ``memory`` predict.

* ``CommLog``: every collective issued inside its ``with`` block, seen at the ``c10d`` operator
  level through a ``TorchDispatchMode``, and every point-to-point ``send`` (as collective
  ``"send"``, its bytes those of the tensor sent; ``volume()`` leaves sends out). That level
  sees DDP's reducer, FSDP1 and FSDP2 alike (FSDP2 calls the c10d operators directly, so
  patching ``torch.distributed.*`` functions would miss it). It observes *what was called*;
  the bytes it attaches to a call (``CommRecord.ring_share_bytes``, ``volume()``) are the ring
  formula of ``costs``, not a measurement.
* ``WireBytes``, ``gloo_wire_bytes``: bytes measured on a gloo rank's sockets and gloo's model
  of them live in ``wire`` (re-exported here).
* ``state_bytes``: parameters, gradients, optimizer state and communication buffers a rank
  holds, measured where they are allocated when an ``allocations.Census`` is running (as in
  ``measure_step``: DDP's bucket copy of the gradients shows), else the sizes of the model's and
  optimizer's tensors (a DTensor shard or an FSDP1 flat shard counts for what this rank stores).
* ``peak_memory``: CUDA's allocator statistics on GPU, PyTorch's ``MemTracker`` on CPU, and
  beside it, when a census runs, the census's peak (every storage allocated and alive at the
  worst moment) with its attribution.
* ``time_steps``: median wall time of repeated steps, synchronising CUDA around each when the
  steps run on a GPU (``sync``: a CPU rank never opens a CUDA context).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from .allocations import Census
from .costs import StepVolume, ring_bytes
from .memory import Ledger
from .launch import device
# Bytes on the wire moved to ``wire``; their names stay importable from here.
from .wire import (GLOO_MAX_SEGMENT, GLOO_PREAMBLE, TCPI_BYTES_ACKED,  # noqa: F401
                   TCPI_BYTES_RECEIVED, TCPI_BYTES_SENT, WireBytes, WireCount, gloo_broadcast, gloo_ring_allgather,
                   gloo_ring_allreduce, gloo_step_wire, gloo_wire_bytes, store_barrier,
                   store_ports, tcp_snapshot, wire_unavailable)

# c10d operator -> (collective, argument whose tensors have the *full* size)
_C10D_OPS = {
    "allreduce_": ("all_reduce", "tensors"),
    "allreduce_coalesced_": ("all_reduce", "tensors"),
    "_allgather_base_": ("all_gather", "output_tensor"),
    "allgather_": ("all_gather", "output_tensors"),
    "allgather_into_tensor_coalesced_": ("all_gather", "outputs"),
    "_reduce_scatter_base_": ("reduce_scatter", "input_tensor"),
    "reduce_scatter_": ("reduce_scatter", "input_tensors"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs"),
    "broadcast_": ("broadcast", "tensors"),
    "reduce_": ("reduce", "tensors"),
    "alltoall_base_": ("all_to_all", "input"),
    "send": ("send", "tensors"),  # point to point (dist.send, dist.isend): the bytes handed over
}


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    return 0


def _element_size(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.element_size()
    if isinstance(obj, (list, tuple)):
        return next((s for s in map(_element_size, obj) if s), 0)
    return 0


@dataclass(frozen=True)
class CommRecord:
    """One collective: its kind, full tensor bytes, group size and the pass it ran in."""

    op: str  # the c10d operator, e.g. "_allgather_base_"
    collective: str  # all_reduce, all_gather, reduce_scatter, broadcast, ...
    nbytes: int
    group_size: int
    phase: str  # "forward" (outside autograd) or "backward" (inside the autograd engine)
    group_ranks: tuple[int, ...] = ()  # global ranks of its process group (hybrid: which group)
    element_size: int = 4  # bytes per element of its tensors (gloo's segments are whole elements)

    @property
    def ring_share_bytes(self) -> float:
        """A formula, not a measurement: the bytes this rank would send for this call under the
        ring algorithm (NCCL's ring; ``costs.ring_bytes``), or the tensor of a ``send``.
        Bytes measured on the wire: ``WireBytes``; gloo's own algorithm: ``gloo_wire_bytes``."""
        if self.collective == "send":
            return float(self.nbytes)
        return ring_bytes(self.collective, self.nbytes, self.group_size)

    @property
    def sent_bytes(self) -> float:
        """Deprecated name of ``ring_share_bytes`` (same value): the ring *formula* applied to
        what was called, not bytes measured on the wire."""
        return self.ring_share_bytes


def bytes_by_group(sends) -> dict[tuple[int, ...], dict[str, float]]:
    """``{group ranks: {collective: bytes sent}}`` from ``(group ranks, collective, bytes sent)``
    triples: one rank's traffic split by process group, as hybrid sharding needs it."""
    out: dict[tuple[int, ...], dict[str, float]] = {}
    for group, collective, sent in sends:
        per = out.setdefault(tuple(group), {})
        per[collective] = per.get(collective, 0.0) + sent
    return out


class CommLog(TorchDispatchMode):
    """Record the collectives issued inside ``with CommLog() as log:``."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[CommRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            self._record(func, args, kwargs)
        return func(*args, **kwargs)

    def _record(self, func, args, kwargs) -> None:
        name = func._schema.name.split("::")[-1]
        if name not in _C10D_OPS:
            return  # barrier, recv (its bytes are the peer's send) and friends: not accounted for
        collective, tensor_arg = _C10D_OPS[name]
        bound = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
        group = torch.distributed.ProcessGroup.unbox(bound["process_group"])
        in_backward = torch._C._current_graph_task_id() != -1
        tensors = bound[tensor_arg]
        self.records.append(CommRecord(name, collective, _tensor_bytes(tensors),
                                       group.size(), "backward" if in_backward else "forward",
                                       tuple(torch.distributed.get_process_group_ranks(group)),
                                       _element_size(tensors) or 4))

    def volume(self) -> StepVolume:
        """The records summed in the shape ``costs`` predicts: the ring *formula*'s bytes one
        rank sends (``CommRecord.ring_share_bytes``), not bytes measured on the wire."""
        sums = {"all_gather_forward": 0.0, "all_gather_backward": 0.0, "reduce_scatter": 0.0,
                "all_reduce": 0.0}
        for r in self.records:
            if r.collective == "all_gather":
                sums[f"all_gather_{r.phase}"] += r.ring_share_bytes
            elif r.collective in sums:
                sums[r.collective] += r.ring_share_bytes
        return StepVolume(**sums)


def settle_collectives(pause: float = 0.01) -> None:
    """Let the gloo backend let go of the collectives that have finished, before memory is read.

    gloo runs each collective on one of its worker threads (2 per group), which drops its
    reference to the finished work, and with it to the work's output tensor, only after
    ``wait()`` has returned in the rank's thread (``ProcessGroupGloo::runLoop``:
    ``workInProgress_[workerIndex].reset()`` comes after ``execute``); the storage's Python
    object then dies on that thread, which needs the GIL. Read at once, memory still holds the
    last buffer a program let go of: FSDP2's last AllGather output, 264 960 B, in 12 of 800
    marks of ``benchmarks/fsdp_memory_race.py``. A barrier on the default group (outside any
    dispatch mode, so that a ``MemTracker`` does not count its own tensor) waits on a round trip
    to every peer with the GIL released, then ``pause`` seconds more, beyond the interpreter's
    5 ms switch interval, let the worker take the GIL: 0 of 800 marks off after it. No-op
    without a process group and on NCCL, where ``torch.cuda`` statistics are read instead."""
    if not dist.is_initialized() or dist.get_backend() != "gloo":
        return
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        dist.barrier()
    time.sleep(pause)


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for ``t``: the local shard of a DTensor, else the tensor."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


@dataclass(frozen=True)
class StateBytes:
    """Bytes of training state on one rank (activations are not state: see ``peak_memory``),
    and, measured by a census (``method="census"``), the communication buffers that outlive
    the step (``buffers``: DDP's buckets) and the rest of what the process allocated and still
    holds (``other``: the batch, activations still referenced, Adam's step counters,
    leftovers)."""

    params: int
    grads: int
    optimizer: int
    buffers: int = 0
    other: int = 0
    method: str = "tensors"  # "census": allocations; "tensors": sizes of the model's tensors

    @property
    def state(self) -> int:
        """Parameters, gradients and optimizer state: ``memory.Ledger.state``."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        """The state, as ``state`` (the name pages used before buffers were measured);
        ``as_ledger().total`` adds the buffers."""
        return self.state

    def as_ledger(self) -> Ledger:
        """The same bytes as a ``memory.Ledger``, to compare with ``vram_ledger``: the state
        ``measure_step`` reads (fp32, Adam, right after ``optimizer.step()``) is the ledger's
        ``phase="rest"`` with its defaults, DDP's buckets its ``buffers``."""
        return Ledger(self.params, self.grads, self.optimizer, buffers=self.buffers)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                census: Census | None = None) -> StateBytes:
    """Parameters, gradients, optimizer state and communication buffers of ``model`` as stored
    on this rank.

    Measured (``method="census"``) when a census runs (``census``, else the innermost one
    entered, ``allocations.Census.current()``): the bytes of the storages the process allocated
    and still holds, by category (``Census.breakdown``). On gloo, call ``settle_collectives()``
    first. Without a census, the sizes of the model's and optimizer's tensors: that cannot see
    what the wrapper allocated (``buffers`` and ``other`` are 0).

    Optimizer entries with a single element (Adam's ``step`` counter) are left out of
    ``optimizer``: they are bookkeeping, not state that scales with the model.
    """
    census = census or Census.current()
    if census is not None:
        b = census.breakdown(model, optimizer)
        return StateBytes(b["parameters"], b["gradients"], b["optimizer"], b["buffers"],
                          b["activations"] + b["other"], "census")
    params = list(model.parameters())
    p_bytes = sum(local_bytes(p) for p in params)
    g_bytes = sum(local_bytes(p.grad) for p in params if p.grad is not None)
    o_bytes = 0
    if optimizer is not None:
        for st in optimizer.state.values():
            o_bytes += sum(local_bytes(v) for v in st.values()
                           if isinstance(v, torch.Tensor) and v.numel() > 1)
    return StateBytes(p_bytes, g_bytes, o_bytes)


@dataclass
class PeakMemory:
    """Peak bytes during a run, and how it was measured: ``"cuda"`` (the caching allocator's
    statistics) or ``"memtracker"`` (``breakdown``: by ``MemTracker``'s categories). When an
    ``allocations.Census`` ran, ``allocated`` is its peak over the same run and ``parts`` its
    attribution then, by ``allocations.CATEGORIES`` (summing to ``allocated``)."""

    peak: int
    method: str
    breakdown: dict[str, int] = field(default_factory=dict)
    allocated: int = 0
    parts: dict[str, int] = field(default_factory=dict)


def peak_memory(run: Callable[[], None], *tracked: Iterable) -> PeakMemory:
    """Peak memory while ``run()`` executes on this rank.

    On CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak. On CPU: PyTorch's
    ``MemTracker``, which needs the model and optimizer created before it (pass them as
    ``tracked``); its peak counts parameters, gradients, optimizer state, activations and
    temporaries, per category (a storage allocated before it began counts from the first
    operator that writes it: DDP's buckets, as temporaries, when the gradients are copied in;
    one that no operator touches, such as the batch, does not count). When a census runs
    (``allocations.Census.current()``), its peak over ``run`` is ``allocated``: everything
    allocated since the census began and alive at the worst moment, attributed in ``parts``.
    """
    census = Census.current()
    if census is not None:
        census.watch(*(m for m in tracked if isinstance(m, torch.nn.Module)))
        census.reset_peak()
    if device().type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return _with_census(PeakMemory(torch.cuda.max_memory_allocated(), "cuda"), census,
                            tracked)
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*tracked)
    with tracker:
        tracker.reset_mod_stats()
        run()
    snap = tracker.get_tracker_snapshot("peak")
    cpu = next((v for k, v in snap.items() if torch.device(k).type == "cpu"), {})
    breakdown = {str(k): int(v) for k, v in cpu.items()}
    return _with_census(PeakMemory(int(cpu.get("Total", 0)), "memtracker", breakdown), census,
                        tracked)


def _with_census(peak: PeakMemory, census: Census | None, tracked) -> PeakMemory:
    """``peak`` with the census's own peak over the same run and its attribution then."""
    if census is not None:
        model = next((m for m in tracked if isinstance(m, torch.nn.Module)), None)
        opt = next((o for o in tracked if isinstance(o, torch.optim.Optimizer)), None)
        peak.allocated = census.peak_bytes()
        peak.parts = census.breakdown(model, opt, at_peak=True)
    return peak


def sync(dev: torch.device) -> None:
    """Wait for the work queued on ``dev``: a GPU runs kernels after the call that queued them
    returns. Nothing to wait for on the CPU, and asking CUDA there (a CUDA build of torch has it
    available even on a gloo rank) would open a context on GPU 0 in every rank."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_steps(step: Callable[[], None], repeats: int = 5, warmup: int = 1,
               dev: torch.device | None = None) -> list[float]:
    """Wall time in seconds of ``repeats`` calls of ``step`` after ``warmup`` calls; ``step``
    runs on ``dev`` (by default this rank's device, ``launch.device()``)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"cần repeats >= 1 và warmup >= 0, nhận được {repeats}, {warmup}.")
    dev = device() if dev is None else dev
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        sync(dev)
        t0 = time.perf_counter()
        step()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return times


def _training_setup(rank: int, world_size: int, par, model_kwargs: dict | None,
                    batch_size: int):
    from .data import rank_batch, synthetic_regression
    from .models import Block, build_mlp, num_params
    from .train import Parallel, apply_parallel

    par = par or Parallel()
    model = build_mlp(**(model_kwargs or {}))
    in_blocks = {id(p) for m in model.modules() if isinstance(m, Block) for p in m.parameters()}
    root_params = sum(p.numel() for p in model.parameters() if id(p) not in in_blocks)
    total_params = num_params(model)
    wrapped = apply_parallel(model, par)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    ds = synthetic_regression(batch_size * world_size, model.blocks[0].linear.in_features,
                              model.head.out_features)
    dev = next(wrapped.parameters()).device
    x, y = rank_batch(ds.tensors, rank, batch_size, dev)
    info = {"label": par.label, "backend": dist.get_backend(), "rank": rank,
            "num_params": total_params, "root_params": root_params}
    return wrapped, optimizer, x, y, info


def _measured_step(wrapped, optimizer, x, y) -> tuple[CommLog, WireBytes]:
    store_barrier()  # the previous step's last sends are written before the counters are read
    with WireBytes() as wire, CommLog() as log:
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        optimizer.step()
        store_barrier()  # and this step's, before they are read again
    # No rank goes on (and, at the end, closes its connections) before every rank has read its
    # counters; the barrier's own messages can reach a slower rank's ``received``, not ``sent``.
    dist.barrier()
    return log, wire


def measure_traffic(rank: int, world_size: int, par=None, model_kwargs: dict | None = None,
                    batch_size: int = 8, warmup: int = 2) -> dict:
    """Rank function for ``launch.spawn``: the communication of one training step only (after
    ``warmup`` steps), as ``measure_step`` reports it but without memory and timing: the
    collectives (``records``), the ring formula's bytes (``volume``) and the bytes counted on
    this rank's sockets (``wire``: a ``WireCount``, None off gloo; ``wire_why`` says why)."""
    from .train import train_step

    wrapped, optimizer, x, y, info = _training_setup(rank, world_size, par, model_kwargs,
                                                     batch_size)
    for _ in range(warmup):
        train_step(wrapped, optimizer, x, y)
    log, wire = _measured_step(wrapped, optimizer, x, y)
    optimizer.zero_grad(set_to_none=True)
    return info | {"volume": log.volume(), "records": log.records, "wire": wire.count,
                   "wire_why": wire.why}


def measure_step(rank: int, world_size: int, par=None, model_kwargs: dict | None = None,
                 batch_size: int = 8, warmup: int = 2, repeats: int = 3) -> dict:
    """Rank function for ``launch.spawn``: wrap a small MLP as ``par`` says, train it, and
    measure one step after ``warmup`` steps (DDP rebuilds its buckets after the first step,
    Adam creates its state at the first step).

    Returns the collectives of that step (``records``; ``volume``: the ring formula's bytes for
    them), the bytes counted on this rank's sockets (``wire``, None off gloo), the state bytes
    right after ``optimizer.step()`` (gradients still present), measured by an
    ``allocations.Census`` that runs from before the model is built, the peak memory (with the
    census's beside it on CPU) and the median step time, with the numbers the formulas need
    (``num_params``, ``root_params``: parameters no ``Block`` owns).
    """
    from .train import train_step

    with Census() as census:  # from before the model exists: every allocation of the run
        wrapped, optimizer, x, y, info = _training_setup(rank, world_size, par, model_kwargs,
                                                         batch_size)
        dev = x.device
        for _ in range(warmup):
            train_step(wrapped, optimizer, x, y)
        log, wire = _measured_step(wrapped, optimizer, x, y)
        settle_collectives()
        state = state_bytes(wrapped, optimizer, census)
        optimizer.zero_grad(set_to_none=True)
        peak = peak_memory(lambda: train_step(wrapped, optimizer, x, y), wrapped, optimizer)
    times = time_steps(lambda: train_step(wrapped, optimizer, x, y), repeats=repeats, warmup=0,
                       dev=dev)
    return info | {
        "volume": log.volume(),
        "records": log.records,
        "wire": wire.count,
        "wire_why": wire.why,
        "state": state,
        "peak": peak,
        "step_times": times,
    }
