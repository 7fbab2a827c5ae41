"""A real DDP run that records its buckets: a worker for ``dpbook.launch.spawn`` that wraps the
bucket demo model (``models.BucketNet``) in DDP with given caps and time-stamps, on each rank,
when every gradient is ready and when each bucket's AllReduce is launched and finishes.

The worker lives here, at module top level, so that the spawn start method can import it by
name; ``measured_timeline`` turns its traces into a ``dpbook.overlap.Timeline``.
``rebuild_runs`` records, step by step, which buckets DDP's reducer used under a few
``buckets.DdpSetting``s (``find_unused_parameters``, ``static_graph``,
``DDP_SET_LAST_BUCKET_CAP``), and the step whose forward rebuilt them, on the demo model or on
any ``Probe`` (a model and its inputs, importable by name), all cases in one launch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..buckets import (Bucket, DdpSetting, Param, cap_limits, ddp_kwargs, ddp_named_params,
                       model_params)
from ..launch import describe_mode, spawn
from ..models import BUCKET_NET_D_IN, build_bucket_net
from ..overlap import DEFAULT_BATCH, CommSpan, LayerSpan, Timeline, layer_times

# The model stays on the CPU, and the time stamps are host clocks: on a GPU they would time
# kernel launches, not the work.
BACKEND = "gloo"
BASELINE_CAP_MB = 1000.0  # larger than the demo model: one bucket
CAP_CHOICES_MB = (0.02, 0.05, 0.1, 0.2, 0.5)  # the caps the widget offers, all measured below


@dataclass(frozen=True)
class DdpTrace:
    """One DDP configuration on one rank: the buckets DDP used after warm-up, and the times of
    one recorded backward (seconds after ``backward()`` was called)."""

    bucket_cap_mb: float | None
    first_bucket_cap_mb: float | None
    params: tuple[Param, ...]
    first_ready_order: tuple[int, ...]  # order seen in iteration 1, the one DDP rebuilds from
    first_iteration_buckets: tuple[tuple[int, ...], ...]  # before the rebuild
    buckets: tuple[tuple[int, ...], ...]  # parameter indices per bucket.index()
    bucket_numel: tuple[int, ...]
    ready_s: tuple[float, ...]  # per parameter
    hook_s: tuple[float, ...]  # per bucket: comm hook called (AllReduce launched)
    done_s: tuple[float, ...]  # per bucket: its future completed
    backward_s: float
    baseline_s: float  # the same backward with one bucket (AllReduce after backward)
    baseline_compute_s: float  # when that run's last gradient was ready
    world_size: int
    batch: int


class _Recorder:
    """State of the comm hook and of the gradient hooks during one backward."""

    def __init__(self, n_params: int, world_size: int):
        self.world_size, self.t0 = world_size, time.perf_counter()
        self.ready, self.order = [0.0] * n_params, []
        self.hook, self.done, self.buckets = {}, {}, {}
        self.calls: list[tuple[int, ...]] = []  # bucket contents, in launch order
        self.index: dict[int, int] = {}  # id(parameter) -> index in DDP's list

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def grad_ready(self, p: torch.Tensor) -> None:
        i = self.index[id(p)]
        self.ready[i] = self.now()
        self.order.append(i)


def _comm_hook(rec: _Recorder, bucket):
    """DDP's default hook (average by AllReduce), plus time stamps and the bucket's contents."""
    k = bucket.index()
    rec.hook[k] = rec.now()
    rec.buckets[k] = (tuple(rec.index[id(p)] for p in bucket.parameters()),
                      bucket.buffer().numel())
    buf = bucket.buffer().div_(rec.world_size)
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def finished(f):
        rec.done[k] = rec.now()
        return f.value()[0]
    return fut.then(finished)


def _one_step(ddp, rec: _Recorder, x: torch.Tensor) -> float:
    # Line the ranks up first: an AllReduce ends only when the slower rank joins it, and a rank
    # that starts late would make every bucket look slow on the other.
    dist.barrier()
    loss = ddp(x).sum()
    rec.ready, rec.order = [0.0] * len(rec.ready), []
    rec.hook, rec.done, rec.buckets = {}, {}, {}
    rec.t0 = time.perf_counter()
    loss.backward()
    return rec.now()


def _recorded_ddp(seed: int, world_size: int, kwargs: dict, hook, build=build_bucket_net):
    """``build(seed)`` (BucketNet by default) in DDP built with ``kwargs``, with a ``_Recorder``
    that every parameter's gradient-ready hook and DDP's comm hook ``hook`` report to."""
    model = build(seed)
    ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
    tensors = [p for *_, p in ddp_named_params(model)]
    rec = _Recorder(len(tensors), world_size)
    rec.index.update({id(p): i for i, p in enumerate(tensors)})
    for p in tensors:
        p.register_post_accumulate_grad_hook(rec.grad_ready)
    ddp.register_comm_hook(rec, hook)
    return ddp, rec


def _trace_config(rank, world_size, cap, first, batch, warmup, repeats, seed) -> dict:
    ddp, rec = _recorded_ddp(seed, world_size, ddp_kwargs(cap, first), _comm_hook)
    gen = torch.Generator().manual_seed(seed + rank)
    steps, first_order, first_buckets = [], None, None
    for it in range(warmup + repeats):
        total = _one_step(ddp, rec, torch.randn(batch, BUCKET_NET_D_IN, generator=gen))
        ddp.zero_grad(set_to_none=True)
        if it == 0:
            first_order = tuple(rec.order)
            first_buckets = tuple(rec.buckets[k][0] for k in sorted(rec.buckets))
        if it >= warmup:
            steps.append((total, tuple(rec.ready), dict(rec.hook), dict(rec.done),
                          dict(rec.buckets)))
    steps.sort(key=lambda s: s[0])
    total, ready, hook, done, buckets = steps[len(steps) // 2]  # the median step
    n = len(buckets)
    return {"bucket_cap_mb": cap, "first_bucket_cap_mb": first,
            "first_ready_order": first_order, "first_iteration_buckets": first_buckets,
            "buckets": tuple(buckets[k][0] for k in range(n)),
            "bucket_numel": tuple(buckets[k][1] for k in range(n)), "ready_s": ready,
            "hook_s": tuple(hook[k] for k in range(n)),
            "done_s": tuple(done[k] for k in range(n)), "backward_s": total}


def ddp_bucket_worker(rank: int, world_size: int, configs=((0.1, None),),
                      batch: int = DEFAULT_BATCH, warmup: int = 2, repeats: int = 5,
                      seed: int = 0) -> list[DdpTrace]:
    """Rank function for ``launch.spawn``: for each ``(bucket_cap_mb, first_bucket_cap_mb)``,
    wrap the demo model in DDP, run ``warmup`` iterations (DDP rebuilds its buckets after the
    first), then record ``repeats`` backward passes and keep the median one."""
    params = tuple(model_params(build_bucket_net(seed)))
    raw = [_trace_config(rank, world_size, cap, first, batch, warmup, repeats, seed)
           for cap, first in configs]
    # The no-overlap baseline, measured with the same machinery: a cap larger than the model
    # gives one bucket, launched when the last gradient is ready.
    base = _trace_config(rank, world_size, BASELINE_CAP_MB, None, batch, warmup, repeats, seed)
    return [DdpTrace(params=params, baseline_s=base["backward_s"],
                     baseline_compute_s=max(base["ready_s"]), world_size=world_size,
                     batch=batch, **r) for r in raw]


MEASURED_CONFIGS = tuple((c, None) for c in CAP_CHOICES_MB) + ((0.1, 0.02),)


def describe(world_size: int = 2) -> str:
    """How ``measure`` runs its ranks, in the reader's words."""
    return describe_mode(world_size, backend=BACKEND)


def measure(configs=MEASURED_CONFIGS, batch: int = DEFAULT_BATCH,
            world_size: int = 2, **spawn_kwargs) -> dict:
    """Run ``ddp_bucket_worker`` on ``world_size`` gloo ranks (about 3-5 s here); return rank
    0's traces keyed by ``(bucket_cap_mb, first_bucket_cap_mb)``."""
    results = spawn(ddp_bucket_worker, tuple(configs), batch, world_size=world_size,
                    backend=BACKEND, **spawn_kwargs)
    return {(t.bucket_cap_mb, t.first_bucket_cap_mb): t for t in results[0]}


def measured_timeline(tr: DdpTrace) -> Timeline:
    """The recorded backward as a ``Timeline``: a layer ends when its last gradient is ready,
    a bucket's AllReduce runs from its hook call to its future's completion."""
    params = tr.params
    buckets = tuple(Bucket(k, ix, sum(params[i].nbytes for i in ix), 0)  # limit: not recorded
                    for k, ix in enumerate(tr.buckets))
    seq = sorted(range(len(params)), key=lambda i: tr.ready_s[i])
    layers, t = [], 0.0
    for name, _, ix in layer_times(params, seq):
        end = max(tr.ready_s[i] for i in ix)
        layers.append(LayerSpan(name, t, end, ix))
        t = end
    comms = tuple(CommSpan(k, max(tr.ready_s[i] for i in ix), tr.hook_s[k], tr.done_s[k])
                  for k, ix in enumerate(tr.buckets))
    label = (f"Thời gian: ĐO trên máy này (gloo, {tr.world_size} rank CPU, batch {tr.batch}, "
             "một bước sau khởi động, rank 0)")
    limits = cap_limits(tr.bucket_cap_mb, tr.first_bucket_cap_mb)
    return Timeline("measured", label, params, buckets, tuple(layers), comms, tr.ready_s,
                    t, tr.backward_s, tr.baseline_s, (limits[0], limits[1]),
                    tr.baseline_compute_s)


LAST_BUCKET_ENV = "DDP_SET_LAST_BUCKET_CAP"  # read by the C++ reducer when it rebuilds


def bucket_net_input(batch: int, generator: torch.Generator) -> torch.Tensor:
    """One input batch of the demo model."""
    return torch.randn(batch, BUCKET_NET_D_IN, generator=generator)


@dataclass(frozen=True)
class Probe:
    """A model to wrap in DDP, given by importable callables (the ranks rebuild it by name):
    ``build(seed)`` returns the model, the same on every rank; ``example(batch, generator)`` one
    input batch; the loss is the sum of the output."""

    name: str
    build: Callable[[int], nn.Module]
    example: Callable[[int, torch.Generator], torch.Tensor]

    def __post_init__(self):
        if not (callable(self.build) and callable(self.example)):
            raise ValueError("Probe cần hai hàm gọi được: một hàm trả về mô hình từ seed, một "
                             "hàm trả về một batch đầu vào.")


BUCKET_NET = Probe("BucketNet", build_bucket_net, bucket_net_input)


@dataclass(frozen=True)
class RebuildRun:
    """One ``DdpSetting`` over a few training steps on one rank: the buckets the reducer used
    in each step (parameter indices per ``bucket.index()``, in the order the comm hook saw them),
    and the step whose forward rebuilt them (``DistributedDataParallel._has_rebuilt_buckets``
    turned true), ``None`` if none did."""

    setting: DdpSetting
    steps: tuple[tuple[tuple[int, ...], ...], ...]
    rebuilt_at: int | None
    ready_order: tuple[int, ...]  # order of the gradients in step 1
    model: str = BUCKET_NET.name  # the Probe's name
    params: tuple[Param, ...] = ()  # the model's parameters in DDP's order (buckets.model_params)


def _layout_hook(rec: _Recorder, bucket):
    """DDP's default hook, noting each bucket's parameters in the order the reducer launches
    them. (Not ``bucket.index()``: in the first step with ``static_graph=True`` the reducer
    launches every bucket at the end of backward, and the index it reports is not the
    bucket's.)"""
    rec.calls.append(tuple(rec.index[id(p)] for p in bucket.parameters()))
    buf = bucket.buffer().div_(rec.world_size)
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


def _history(rank: int, world_size: int, setting: DdpSetting, steps: int, batch: int,
             seed: int, probe: Probe = BUCKET_NET) -> RebuildRun:
    before = os.environ.get(LAST_BUCKET_ENV)
    if setting.last_bucket_cap:  # set before DDP is built; the reducer reads it when rebuilding
        os.environ[LAST_BUCKET_ENV] = "1"
    else:
        os.environ.pop(LAST_BUCKET_ENV, None)
    try:
        ddp, rec = _recorded_ddp(seed, world_size, setting.kwargs(), _layout_hook, probe.build)
        gen = torch.Generator().manual_seed(seed + rank)
        layouts, rebuilt_at, ready = [], None, ()
        for step in range(1, steps + 1):
            out = ddp(probe.example(batch, gen))
            if rebuilt_at is None and ddp._has_rebuilt_buckets:
                rebuilt_at = step
            rec.order, rec.calls = [], []
            out.sum().backward()
            layouts.append(tuple(rec.calls))
            ready = tuple(rec.order) if step == 1 else ready
            ddp.zero_grad(set_to_none=True)
    finally:
        if before is None:
            os.environ.pop(LAST_BUCKET_ENV, None)
        else:
            os.environ[LAST_BUCKET_ENV] = before
    return RebuildRun(setting, tuple(layouts), rebuilt_at, ready, probe.name,
                      tuple(model_params(probe.build(seed))))


def _cases(settings) -> list[tuple[Probe, DdpSetting]]:
    """Each item: a ``DdpSetting`` (on the demo model) or a ``(Probe, DdpSetting)`` pair."""
    out = []
    for s in settings:
        if isinstance(s, DdpSetting):
            out.append((BUCKET_NET, s))
        elif (isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], Probe)
              and isinstance(s[1], DdpSetting)):
            out.append(s)
        else:
            raise ValueError("settings phải là các buckets.DdpSetting hoặc cặp "
                             f"(Probe, DdpSetting), nhận được {s!r}.")
    return out


def rebuild_worker(rank: int, world_size: int, settings=(DdpSetting(),), steps: int = 4,
                   batch: int = 8, seed: int = 0) -> list[RebuildRun]:
    """Rank function for ``launch.spawn``: ``_history`` of each setting (or ``(Probe,
    setting)`` pair), one after another."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps phải là số nguyên >= 1, nhận được {steps!r}.")
    return [_history(rank, world_size, s, steps, batch, seed, probe)
            for probe, s in _cases(settings)]


def rebuild_runs(settings, steps: int = 4, world_size: int = 2, **spawn_kwargs) -> list:
    """Run ``rebuild_worker`` on ``world_size`` gloo ranks (one launch, about 3 s here); return
    rank 0's ``RebuildRun``s, in the order of ``settings`` (``DdpSetting``s on the demo model,
    or ``(Probe, DdpSetting)`` pairs), after checking that every rank saw the same buckets
    (rank 0 broadcasts its layout when DDP rebuilds)."""
    _cases(settings)  # refuse bad input before any process starts
    results = spawn(rebuild_worker, tuple(settings), steps, world_size=world_size,
                    backend=BACKEND, **spawn_kwargs)
    for other in results[1:]:
        if [r.steps for r in other] != [r.steps for r in results[0]]:
            raise RuntimeError("Các rank dùng bucket khác nhau: điều DDP không cho phép.")
    return results[0]
