"""Measure in a real run what ``costs`` and ``memory`` predict.

* ``CommLog``: every collective issued inside its ``with`` block, seen at the ``c10d`` operator
  level through a ``TorchDispatchMode``, and every point-to-point ``send`` (as collective
  ``"send"``, its bytes those of the tensor sent; ``volume()`` leaves sends out). That level sees DDP's reducer, FSDP1 and FSDP2 alike
  (FSDP2 calls the c10d operators directly, so patching ``torch.distributed.*`` functions would
  miss it).
* ``state_bytes``: parameters, gradients and optimizer state a rank holds, by local size (a
  DTensor shard or an FSDP1 flat shard counts for what this rank stores).
* ``peak_memory``: CUDA's allocator statistics on GPU, PyTorch's ``MemTracker`` on CPU.
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

from .costs import StepVolume, ring_bytes
from .memory import Ledger
from .launch import device

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


@dataclass(frozen=True)
class CommRecord:
    """One collective: its kind, full tensor bytes, group size and the pass it ran in."""

    op: str  # the c10d operator, e.g. "_allgather_base_"
    collective: str  # all_reduce, all_gather, reduce_scatter, broadcast, ...
    nbytes: int
    group_size: int
    phase: str  # "forward" (outside autograd) or "backward" (inside the autograd engine)
    group_ranks: tuple[int, ...] = ()  # global ranks of its process group (hybrid: which group)

    @property
    def sent_bytes(self) -> float:
        """What this rank sends for it: the tensor of a ``send``, else the ring algorithm's
        share of a collective."""
        if self.collective == "send":
            return float(self.nbytes)
        return ring_bytes(self.collective, self.nbytes, self.group_size)


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
        self.records.append(CommRecord(name, collective, _tensor_bytes(bound[tensor_arg]),
                                       group.size(), "backward" if in_backward else "forward",
                                       tuple(torch.distributed.get_process_group_ranks(group))))

    def volume(self) -> StepVolume:
        """The records summed in the shape ``costs`` predicts (bytes one rank sends)."""
        sums = {"all_gather_forward": 0.0, "all_gather_backward": 0.0, "reduce_scatter": 0.0,
                "all_reduce": 0.0}
        for r in self.records:
            if r.collective == "all_gather":
                sums[f"all_gather_{r.phase}"] += r.sent_bytes
            elif r.collective in sums:
                sums[r.collective] += r.sent_bytes
        return StepVolume(**sums)


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for ``t``: the local shard of a DTensor, else the tensor."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


@dataclass(frozen=True)
class StateBytes:
    """Bytes of training state on one rank (activations are not state: see ``peak_memory``)."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_ledger(self) -> Ledger:
        """The same bytes as a ``memory.Ledger``, to compare with ``vram_ledger``: the state
        ``measure_step`` reads (fp32, Adam, right after ``optimizer.step()``) is the ledger's
        ``phase="rest"`` with its defaults."""
        return Ledger(self.params, self.grads, self.optimizer)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Parameters, gradients and optimizer state of ``model`` as stored on this rank.

    Optimizer entries with a single element (Adam's ``step`` counter) are left out: they are
    bookkeeping, not state that scales with the model.
    """
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
    """Peak bytes during a run, and how it was measured."""

    peak: int
    method: str  # "cuda" or "memtracker"
    breakdown: dict[str, int] = field(default_factory=dict)


def peak_memory(run: Callable[[], None], *tracked: Iterable) -> PeakMemory:
    """Peak memory while ``run()`` executes on this rank.

    On CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak. On CPU: PyTorch's
    ``MemTracker``, which needs the model and optimizer created before it (pass them as
    ``tracked``); its peak counts parameters, gradients, optimizer state, activations and
    temporaries, per category.
    """
    if device().type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return PeakMemory(torch.cuda.max_memory_allocated(), "cuda")
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*tracked)
    with tracker:
        tracker.reset_mod_stats()
        run()
    snap = tracker.get_tracker_snapshot("peak")
    cpu = next((v for k, v in snap.items() if torch.device(k).type == "cpu"), {})
    breakdown = {str(k): int(v) for k, v in cpu.items()}
    return PeakMemory(int(cpu.get("Total", 0)), "memtracker", breakdown)


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


def measure_step(rank: int, world_size: int, par=None, model_kwargs: dict | None = None,
                 batch_size: int = 8, warmup: int = 2, repeats: int = 3) -> dict:
    """Rank function for ``launch.spawn``: wrap a small MLP as ``par`` says, train it, and
    measure one step after ``warmup`` steps (DDP rebuilds its buckets after the first step,
    Adam creates its state at the first step).

    Returns the collectives of that step, the state bytes right after ``optimizer.step()``
    (gradients still present), the peak memory and the median step time, with the numbers the
    formulas need (``num_params``, ``root_params``: parameters no ``Block`` owns).
    """
    from .data import rank_batch, synthetic_regression
    from .models import Block, build_mlp, num_params
    from .train import Parallel, apply_parallel, train_step

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
    for _ in range(warmup):
        train_step(wrapped, optimizer, x, y)
    with CommLog() as log:
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        optimizer.step()
    state = state_bytes(wrapped, optimizer)
    optimizer.zero_grad(set_to_none=True)
    peak = peak_memory(lambda: train_step(wrapped, optimizer, x, y), wrapped, optimizer)
    times = time_steps(lambda: train_step(wrapped, optimizer, x, y), repeats=repeats, warmup=0,
                       dev=dev)
    return {
        "label": par.label,
        "backend": dist.get_backend(),
        "num_params": total_params,
        "root_params": root_params,
        "volume": log.volume(),
        "records": log.records,
        "state": state,
        "peak": peak,
        "step_times": times,
    }
