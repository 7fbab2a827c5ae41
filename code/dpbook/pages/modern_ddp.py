"""Section 4.2.7 (Thực hành hiện đại (I): DDP — comm hook, tùy chọn, ZeRO-1, gỡ lỗi treo).

* Communication hooks: ``hook_runs`` trains the page's MLP with plain DDP, ``fp16_compress_hook``
  (``bf16_compress_hook`` too under NCCL) and PowerSGD, and records the bytes of every
  all-reduce; ``powersgd_plan`` is the rule of ``powerSGD_hook`` (which tensors it compresses,
  the sizes of P and Q), ``hook_time`` and ``break_even_bytes`` the alpha-beta model of 4.1.4
  applied to a hook's messages.
* DDP's options: ``option_runs`` (``gradient_as_bucket_view``, ``static_graph`` with an unused
  parameter, ``init_sync``, ``forward_sync_buffers``).
* ZeRO-1 without FSDP: ``zero_runs`` (``ZeroRedundancyOptimizer`` beside plain DDP) and
  ``zero_partition``, the optimizer's greedy split of the parameters.
* A hang or a desync: ``desync_runs`` (mismatched collectives with and without
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, ``monitored_barrier``, the flight recorder on gloo);
  ``nccl_hang`` and ``check_dump`` are what ``make gpu-check`` runs on a GPU box.

Rank functions take ``(rank, world_size, ...)`` and are meant for ``launch.spawn``.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import pickle
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import style, vi
from ..checks import int_at_least, non_negative, one_of
from ..costs import alpha_beta_time
from ..data import rank_batch, synthetic_regression
from ..launch import device
from ..measure import CommLog, state_bytes
from ..models import build_mlp, num_params
from ..train import apply_ddp, full_state_dict

# The page's model: 42 376 parameters, four weight matrices (128x64, 128x128, 128x128, 8x128).
MODEL = {"in_dim": 64, "hidden": 128, "depth": 3, "out_dim": 8}
# For ZeRO-1: four equal Linear(64, 64) layers, so the greedy split gives each rank half.
ZERO_MODEL = {"in_dim": 64, "hidden": 64, "depth": 3, "out_dim": 64}
BATCH = 32  # samples per rank per step
HOOKS = ("fp32", "fp16", "PowerSGD r=1", "PowerSGD r=4", "PowerSGD r=1, không error feedback")


# --- PowerSGD's rule, as powerSGD_hook applies it to the tensors of one bucket

def worth_compressing(n: int, m: int, rank: int, min_compression_rate: float = 2) -> bool:
    """``powerSGD_hook``'s test for an ``n x m`` matrix (``_should_compress``): compress when
    ``(n + m) * r * min_compression_rate < n * m``, with ``r = min(n, m, rank)``."""
    for name, value in (("n", n), ("m", m), ("rank", rank)):
        int_at_least(name, value)
    if isinstance(min_compression_rate, bool) or not (
            isinstance(min_compression_rate, (int, float)) and min_compression_rate > 0):
        raise ValueError(f"min_compression_rate phải là số dương, nhận được "
                         f"{min_compression_rate!r}.")
    r = min(n, m, rank)
    return (n + m) * r * min_compression_rate < n * m


@dataclass(frozen=True)
class PowerSGDPlan:
    """What ``powerSGD_hook`` all-reduces for one bucket, in elements: the tensors it leaves
    uncompressed (one concatenated message), then P (``n x r`` per compressed matrix), then Q
    (``m x r``). ``compressed``: the indices of the tensors it compresses."""

    uncompressed: int
    p: int
    q: int
    compressed: tuple[int, ...]
    total_before: int

    @property
    def messages(self) -> tuple[int, int, int]:
        return (self.uncompressed, self.p, self.q)

    @property
    def total(self) -> int:
        return sum(self.messages)

    @property
    def ratio(self) -> float:
        """Elements before / after, what ``PowerSGDState.compression_stats`` reports."""
        return self.total_before / self.total

    def nbytes(self, element_size: int = 4) -> tuple[int, int, int]:
        int_at_least("element_size", element_size)
        return tuple(element_size * e for e in self.messages)


def powersgd_plan(shapes, rank: int, min_compression_rate: float = 2) -> PowerSGDPlan:
    """The three messages of ``powerSGD_hook`` for a bucket holding tensors of ``shapes``: each
    tensor is viewed as ``shape[0] x (the rest)`` (a bias is ``n x 1``, never worth it)."""
    int_at_least("rank", rank)
    shapes = [tuple(s) for s in shapes]
    if not shapes or any(not s or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                      for d in s) for s in shapes):
        raise ValueError(f"shapes phải là danh sách khác rỗng các kích thước nguyên dương, "
                         f"nhận được {shapes!r}.")
    unc = p = q = 0
    compressed = []
    for i, s in enumerate(shapes):
        n, m = s[0], math.prod(s[1:])
        if worth_compressing(n, m, rank, min_compression_rate):
            r = min(n, m, rank)
            p, q = p + n * r, q + m * r
            compressed.append(i)
        else:
            unc += n * m
    return PowerSGDPlan(unc, p, q, tuple(compressed), sum(math.prod(s) for s in shapes))


def hook_time(message_bytes, world_size: int, alpha: float, bandwidth: float) -> float:
    """Alpha-beta time of a hook's all-reduces, one after another (PowerSGD's P needs the
    uncompressed message's future, Q needs P): each pays its latency, even an empty one."""
    return sum(alpha_beta_time("all_reduce", b, world_size, alpha, bandwidth)
               for b in message_bytes)


def break_even_bytes(n_half: float, messages: int, ratio: float) -> float:
    """Bucket size above which ``messages`` all-reduces of ``1/ratio`` of the bytes beat one
    plain all-reduce, in the alpha-beta model: ``n > n_half * (messages - 1) / (1 - 1/ratio)``
    with ``n_half = N alpha beta`` (``overlap.half_size``)."""
    non_negative("n_half", n_half)
    int_at_least("messages", messages)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 1:
        raise ValueError(f"ratio (số byte trước / sau khi nén) phải lớn hơn 1, nhận được "
                         f"{ratio!r}.")
    return n_half * (messages - 1) / (1 - 1 / ratio)


def zero_partition(numels, world_size: int) -> list[list[int]]:
    """``ZeroRedundancyOptimizer._partition_parameters``: parameters sorted by size, largest
    first, each given to the rank with the fewest elements so far (the lowest rank on a tie).
    Returns the parameter indices of each rank."""
    int_at_least("world_size", world_size)
    numels = list(numels)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in numels):
        raise ValueError(f"numels phải là các số nguyên dương, nhận được {numels!r}.")
    sizes, parts = [0] * world_size, [[] for _ in range(world_size)]
    for i in sorted(range(len(numels)), key=lambda k: numels[k], reverse=True):
        r = sizes.index(min(sizes))
        parts[r].append(i)
        sizes[r] += numels[i]
    return parts


# --- measuring the hooks

@contextlib.contextmanager
def record_all_reduce():
    """Record ``(bytes, dtype, thread name)`` of every ``torch.distributed.all_reduce`` call made
    in the block, from any thread. The Python hooks call it through the module (``dist.all_reduce``);
    PowerSGD issues P and Q inside future callbacks, which may run on a gloo thread, where
    ``measure.CommLog`` (a dispatch mode, entered on one thread) does not look. The thread of a
    hook itself is the one autograd runs it on: for CPU parameters the thread that called
    ``backward`` (here MainThread), for CUDA parameters autograd's device thread."""
    calls, original = [], dist.all_reduce

    def recorded(tensor, *args, **kwargs):
        calls.append((tensor.numel() * tensor.element_size(), str(tensor.dtype).split(".")[-1],
                      threading.current_thread().name))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = recorded
    try:
        yield calls
    finally:
        dist.all_reduce = original


def commlog_and_callbacks() -> dict[str, list[int]]:
    """What ``CommLog`` records when a second all-reduce is issued from a future's callback:
    ``"inline"``, the first one already done (the callback runs at once, on this thread);
    ``"later"``, still running (the callback runs when it completes, on gloo's thread). For
    ``"later"`` the other ranks join the first all-reduce 0.3 s late, so that on rank 0 it is
    surely still running when the callback is attached. Returns the bytes recorded each way, and
    ``"threads"``, where each callback ran."""
    out, threads = {}, []
    for how in ("inline", "later"):
        a, b = torch.ones(4, device=device()), torch.ones(3, device=device())

        def second(fut):
            threads.append(threading.current_thread().name)
            return dist.all_reduce(b, async_op=True).get_future().wait()[0]

        if how == "later" and dist.get_rank() != 0:
            time.sleep(0.3)
        with CommLog() as log:
            fut = dist.all_reduce(a, async_op=True).get_future()
            if how == "inline":
                fut.wait()
            fut.then(second).wait()
        out[how] = [r.nbytes for r in log.records]
    out["threads"] = threads
    return out


def register_hook(name: str, model: nn.Module):
    """Register the hook of configuration ``name`` (one of ``hook_configs("nccl")``) on the DDP
    ``model``; return its state (``None`` but for PowerSGD; ``"fp32"`` registers nothing)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    one_of("name", name, hook_configs("nccl"))
    if name in ("fp16", "bf16"):
        model.register_comm_hook(None, getattr(default_hooks, f"{name}_compress_hook"))
        return None
    if name.startswith("PowerSGD"):
        state = powerSGD_hook.PowerSGDState(
            None, matrix_approximation_rank=int(name.split("r=")[1][0]), start_powerSGD_iter=2,
            use_error_feedback="không error feedback" not in name)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    return None


def hook_configs(backend: str) -> tuple[str, ...]:
    """The configurations a run trains: ``HOOKS``, and bf16 where DDP accepts it (NCCL)."""
    return HOOKS + (("bf16",) if backend == "nccl" else ())


def hook_runs(rank: int, world_size: int, steps: int = 40, lr: float = 0.3) -> dict:
    """Rank function: for each configuration of ``hook_configs``, the page's MLP from the same
    initial weights, full-batch SGD on the same data for ``steps`` steps. Per configuration:
    the global mean loss of each step, the all-reduces of each step (``record_all_reduce``; for
    fp32, whose C++ default hook no Python patch sees, ``CommLog``; for fp16 both, to compare),
    PowerSGD's state sizes, and the final weights."""
    int_at_least("steps", steps, 3)
    dev = device()
    ds = synthetic_regression(BATCH * world_size, MODEL["in_dim"], MODEL["out_dim"])
    x, y = rank_batch(ds.tensors, rank, BATCH, dev)
    out = {}
    for name in hook_configs(dist.get_backend()):
        model = apply_ddp(build_mlp(**MODEL))
        state = register_hook(name, model)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        losses, calls, commlog = [], [], []
        for step in range(steps):
            watch = name in ("fp32", "fp16") and step in (0, steps - 1)
            with record_all_reduce() as rec, (CommLog() if watch
                                              else contextlib.nullcontext()) as log:
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
            calls.append(rec)
            commlog.append([r.nbytes for r in log.records] if log is not None else None)
        mean = torch.stack(losses)
        dist.all_reduce(mean)
        out[name] = {
            "losses": (mean / world_size).tolist(), "calls": calls, "commlog": commlog,
            "state": full_state_dict(model),
            "error_numel": (sum(e.numel() for e in state.error_dict.values())
                            if state is not None else 0),
            "pq_numel": (sum(t.numel() for d in (state.p_memory_dict, state.q_memory_dict)
                             for t in d.values()) if state is not None else 0),
            "stats": state.compression_stats() if state is not None else None,
        }
    out["shapes"] = [tuple(p.shape) for p in build_mlp(**MODEL).parameters()]
    out["backend"] = dist.get_backend()
    out["callbacks"] = commlog_and_callbacks()
    return out


def loss_figure(runs: dict, names=None):
    """The global loss of each configuration, step by step (log scale)."""
    import matplotlib.pyplot as plt

    names = names or [n for n in HOOKS if n in runs]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    styles = ("-", "--", "-", "-", ":")
    for i, name in enumerate(names):
        ax.semilogy(range(1, len(runs[name]["losses"]) + 1), runs[name]["losses"],
                    color=style.series_colour(i), lw=2.2, ls=styles[i % len(styles)], label=name)
    ax.set_xlabel("bước")
    ax.set_ylabel("giá trị mất mát (MSE, cả batch toàn cục)")
    ax.set_title("Cùng mô hình, cùng dữ liệu, năm cách gửi gradient")
    ax.legend(fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# --- DDP's options

class WithUnused(nn.Module):
    """Two layers used in ``forward`` and ``aux``, which never is."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.aux = nn.Linear(16, 32), nn.Linear(32, 4), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _bucket_view_run(x, y, as_view: bool) -> dict:
    """Three steps with ``gradient_as_bucket_view=as_view``; after the last backward, where each
    ``.grad`` lives against the bucket buffers (seen by a comm hook) and the distinct bytes that
    gradients and buckets occupy together."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = apply_ddp(build_mlp(**MODEL), gradient_as_bucket_view=as_view)
    buffers = {}

    def hook(state, bucket):
        buf = bucket.buffer()
        buffers[bucket.index()] = (buf.data_ptr(), buf.numel() * buf.element_size())
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        nn.functional.mse_loss(model(x), y).backward()
        if step < 2:
            opt.step()
            opt.zero_grad()
    grads = [p.grad for p in model.parameters()]
    inside = sum(any(start <= g.data_ptr() < start + size for start, size in buffers.values())
                 for g in grads)
    storages = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}
    storages.update({start: size for start, size in buffers.values()})
    return {"inside": inside, "params": len(grads), "buckets": len(buffers),
            "bucket_bytes": sum(size for _, size in buffers.values()),
            "distinct_bytes": sum(storages.values())}


def _rebuild_run(x, y, steps: int, **ddp_kwargs) -> list[dict]:
    """Per step, for ``WithUnused`` wrapped with ``ddp_kwargs``: the broadcasts of the forward
    pass (a rebuild sends the new bucket layout from rank 0), the sizes of the all-reduces of
    backward, and whether ``aux`` got a gradient."""
    torch.manual_seed(0)
    model = apply_ddp(WithUnused().to(x.device), **ddp_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    for _ in range(steps):
        with CommLog() as log:
            nn.functional.mse_loss(model(x[:, :16]), y).backward()
        rows.append({"forward_broadcasts": sum(r.collective == "broadcast" and r.phase == "forward"
                                               for r in log.records),
                     "all_reduces": sorted((r.nbytes for r in log.records
                                            if r.collective == "all_reduce"), reverse=True),
                     "aux_grad": model.module.aux.weight.grad is not None})
        opt.step()
        opt.zero_grad()
    return rows


def _init_sync_run(rank: int, world_size: int, init_sync: bool) -> dict:
    """A model whose weights differ on every rank (seed = rank), wrapped with ``init_sync``:
    the collectives of the constructor, and whether the ranks then hold the same weights."""
    with CommLog() as log:
        model = apply_ddp(build_mlp(seed=rank, **MODEL), init_sync=init_sync)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    low = flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return {"collectives": [(r.collective, r.nbytes) for r in log.records],
            "max_gap": (spread - low).abs().max().item()}


def _buffer_sync_run(x, y, forward_sync_buffers: bool | None) -> dict:
    """A BatchNorm MLP: the broadcasts of one forward pass and the bytes of its buffers."""
    model = apply_ddp(build_mlp(norm="batch", **MODEL), forward_sync_buffers=forward_sync_buffers)
    with CommLog() as log:
        model(x)
    return {"broadcast_bytes": [r.nbytes for r in log.records if r.collective == "broadcast"],
            "buffer_bytes": sum(b.numel() * b.element_size() for b in model.module.buffers())}


def option_runs(rank: int, world_size: int, steps: int = 4) -> dict:
    """Rank function: the measurements of DDP's options (see the helpers above)."""
    dev = device()
    ds = synthetic_regression(BATCH * world_size, MODEL["in_dim"], MODEL["out_dim"])
    x, y = rank_batch(ds.tensors, rank, BATCH, dev)
    y4 = y[:, :4]
    return {
        "bucket_view": {v: _bucket_view_run(x, y, v) for v in (False, True)},
        "rebuild": {name: _rebuild_run(x, y4, steps, **kw) for name, kw in (
            ("find_unused_parameters=True", {"find_unused_parameters": True}),
            ("static_graph=True", {"static_graph": True}))},
        "unused_numel": sum(p.numel() for p in WithUnused().aux.parameters()),
        "with_unused_numel": num_params(WithUnused()),
        "init_sync": {v: _init_sync_run(rank, world_size, v) for v in (True, False)},
        "buffers": {v: _buffer_sync_run(x, y, v) for v in (None, False)},
        "num_params": num_params(build_mlp(**MODEL)),
    }


# --- ZeRO-1 without FSDP

def zero_runs(rank: int, world_size: int, steps: int = 5, lr: float = 1e-2) -> dict:
    """Rank function: ``ZERO_MODEL`` trained ``steps`` steps with Adam under plain DDP and with
    ``ZeroRedundancyOptimizer(..., optimizer_class=Adam)``. Returns the state bytes each holds
    after the last step, the parameters of this rank's partition, and the final weights."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ds = synthetic_regression(BATCH * world_size, ZERO_MODEL["in_dim"], ZERO_MODEL["out_dim"])
    x, y = rank_batch(ds.tensors, rank, BATCH, device())
    out = {}
    for name in ("DDP + Adam", "DDP + ZeroRedundancyOptimizer"):
        model = apply_ddp(build_mlp(**ZERO_MODEL))
        if name == "DDP + Adam":
            opt = inner = torch.optim.Adam(model.parameters(), lr=lr)
        else:
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                          lr=lr)
            inner = opt.optim
        for step in range(steps):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if step < steps - 1:
                opt.zero_grad()
        local = [p for g in inner.param_groups for p in g["params"]]
        index = {id(p): i for i, p in enumerate(model.parameters())}
        out[name] = {"state": state_bytes(model, inner), "local": sorted(index[id(p)] for p in local),
                     "weights": full_state_dict(model)}
    out["numels"] = [p.numel() for p in build_mlp(**ZERO_MODEL).parameters()]
    return out


# --- a hang or a desync

def _mismatch(rank: int, group, dev) -> str | None:
    """Rank 0 all-reduces a tensor, rank 1 broadcasts one of the same shape."""
    t = torch.ones(4, device=dev)
    try:
        if rank == 0:
            dist.all_reduce(t, group=group)
        else:
            dist.broadcast(t, 0, group=group)
    except RuntimeError as exc:
        return str(exc)
    return None


def _timed(fn, *args):
    t0 = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - t0


def desync_runs(rank: int, world_size: int, timeout_s: float = 1.0) -> dict:
    """Rank function: four ways to see a rank stray, each on a fresh group with a ``timeout_s``
    timeout. ``plain``: mismatched collectives on gloo, no debug mode (both ranks wait out the
    timeout). ``detail``: the same after ``dist.set_debug_level_from_env()`` with
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` in the environment, on the ranks' backend (NCCL on a GPU
    box): the group is wrapped and the mismatch reported before any data moves. ``barrier``:
    rank 1 skips a ``monitored_barrier``. ``flight``: rank 1 skips the last of three
    all-reduces; ``dump`` is this rank's flight recorder for that group (``flight_dump``)."""
    wait = datetime.timedelta(seconds=timeout_s)
    out = {"env": os.environ.get("TORCH_DISTRIBUTED_DEBUG"),
           "level_at_start": dist.get_debug_level().name}
    dist.set_debug_level(dist.DebugLevel.OFF)  # the same start, whoever imported torch
    plain = dist.new_group(backend="gloo", timeout=wait)
    out["plain"] = _timed(_mismatch, rank, plain, torch.device("cpu"))
    dist.set_debug_level_from_env()  # torch read the variable once, when it was imported
    out["level_from_env"] = dist.get_debug_level().name
    detail = dist.new_group(timeout=wait)
    out["detail_backend"] = type(detail._get_backend(device())).__name__
    out["detail"] = _timed(_mismatch, rank, detail, device())
    dist.set_debug_level(dist.DebugLevel.OFF)
    side = dist.new_group(backend="gloo", timeout=wait)
    out["barrier"] = _timed(_barrier, rank, side, timeout_s)
    fr = dist.new_group(backend="gloo", timeout=wait)
    out["flight"] = _timed(_skip_last, rank, fr, timeout_s)
    out["dump"], out["pg_config_as_dumped"] = flight_dump(fr)
    return out


def flight_dump(group) -> tuple[dict, dict]:
    """This rank's flight-recorder dump (``_dump_fr_trace``, the pickle NCCL writes on a
    timeout, with stack traces) cut to ``group``'s entries, and the ``pg_config`` as dumped.
    gloo leaves ``pg_config`` without the group's ranks, which the analyzer needs: they are
    filled in from ``dist.get_process_group_ranks``."""
    import torch._C._distributed_c10d as c10d

    dump = pickle.loads(c10d._dump_fr_trace(True, True, False))
    name = dist.distributed_c10d._get_process_group_name(group)
    as_dumped = dump["pg_config"]
    dump["entries"] = [e for e in dump["entries"] if e["process_group"][0] == name]
    dump["pg_config"] = {name: {"name": name, "desc": "undefined",
                                "ranks": str(dist.get_process_group_ranks(group))}}
    return dump, as_dumped


def _barrier(rank: int, group, timeout_s: float) -> str | None:
    if rank == 1:  # stuck elsewhere for longer than the barrier waits
        time.sleep(timeout_s + 0.5)
        return None
    try:
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        return str(exc)
    return None


def _skip_last(rank: int, group, timeout_s: float) -> str | None:
    t = torch.ones(16)
    try:
        for k in range(3):
            if rank == 1 and k == 2:
                time.sleep(timeout_s + 0.5)
                break
            dist.all_reduce(t, group=group)
    except RuntimeError as exc:
        return str(exc)
    return None


def analyse_dumps(dumps, folder: str, prefix: str = "fr_rank_") -> str:
    """Write one dump per rank as ``<folder>/<prefix><rank>`` (the names NCCL gives its dumps)
    and run PyTorch's analyzer on them (``torchfrtrace <folder>``, that is
    ``torch.distributed.flight_recorder.fr_trace.main``); returns what it reports. The analyzer
    reports through the logger "Flight Recorder" (a handler on stderr): the report is taken from
    that logger instead, so that it does not also land on stderr."""
    import io
    import logging

    for r, dump in enumerate(dumps):
        with open(os.path.join(folder, f"{prefix}{r}"), "wb") as f:
            pickle.dump(dump, f)
    buf = io.StringIO()
    log = logging.getLogger("Flight Recorder")
    handler = logging.StreamHandler(buf)
    saved, log.handlers = log.handlers[:], [handler]
    try:
        from torch.distributed.flight_recorder import fr_trace

        added = [h for h in log.handlers if h is not handler]  # the first import adds its own
        log.handlers = [handler]
        with contextlib.redirect_stdout(buf):
            fr_trace.main([folder, "--prefix", prefix])
    finally:
        log.handlers = saved + [h for h in locals().get("added", []) if h not in saved]
    return buf.getvalue()


# --- make gpu-check: the NCCL flight recorder dumps on a watchdog timeout

def flight_recorder_env(prefix: str, buffer_size: int = 2000) -> dict[str, str]:
    """What to export before a job for the NCCL flight recorder: a ring of ``buffer_size``
    entries, a dump when the watchdog sees a timeout (which ``ProcessGroupNCCL.hpp`` says needs
    the monitoring thread too), written to ``<prefix><rank>``. The prefix goes in the old
    name ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, which ``DebugInfoWriter::getWriter``
    (``FlightRecorder.cpp``) still reads after the new ``TORCH_FR_DUMP_TEMP_FILE``."""
    int_at_least("buffer_size", buffer_size)
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"prefix phải là đường dẫn (chuỗi khác rỗng), nhận được {prefix!r}.")
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(buffer_size), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}


def nccl_hang(rank: int, world_size: int, prefix: str, timeout_s: float = 5.0) -> None:
    """Rank function for a GPU box: a group with the recorder on and a ``timeout_s`` timeout,
    two all-reduces, then rank 0 starts a third that rank 1 never joins. Rank 0's watchdog
    times out, dumps the recorder to ``<prefix>0`` and ends the process; rank 1 waits."""
    os.environ.update(flight_recorder_env(prefix))  # read when the NCCL group is created
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
    t = torch.ones(1024, device=device())
    for _ in range(2):
        dist.all_reduce(t, group=group)
    torch.cuda.synchronize()
    if rank == 0:
        dist.all_reduce(t, group=group)
        torch.cuda.synchronize()  # blocks until the watchdog ends the process
    time.sleep(6 * timeout_s + 30)


def check_dump(path: str, collective: str = "all_reduce") -> str | None:
    """What is wrong with the dump at ``path`` (``None`` when it holds an entry for
    ``collective`` that did not complete, the one the job hung in)."""
    if not os.path.isfile(path):
        return f"không có file dump {path}"
    with open(path, "rb") as f:
        dump = pickle.load(f)
    stuck = [e for e in dump.get("entries", []) if collective in e.get("profiling_name", "")
             and e.get("state") != "completed"]
    if not stuck:
        names = sorted({e.get("profiling_name") for e in dump.get("entries", [])})
        return f"dump {path} không có phép {collective} nào chưa xong (có: {names})"
    return None


def describe_dump(path: str) -> str:
    """One line about a dump that ``check_dump`` accepted."""
    with open(path, "rb") as f:
        dump = pickle.load(f)
    last = dump["entries"][-1]
    return (f"{os.path.basename(path)}: {vi.grouped(len(dump['entries']))} mục, mục cuối "
            f"{last['profiling_name']} (SeqNum {last['collective_seq_id']}, {last['state']})")
