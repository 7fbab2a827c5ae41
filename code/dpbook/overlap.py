"""Computation against communication in one DDP backward pass: the alpha-beta model of
section 4.1.4. Pure data, no processes, no drawing.

``alpha_beta_timeline``: when each layer's gradients are ready (compute proportional to its
parameter count) and when each bucket's AllReduce runs (``costs.alpha_beta_time``, one at a
time, as on one communication stream); ``compare_strategies``: one AllReduce per parameter,
buckets, or one AllReduce after backward. ``half_size``, ``transfer_share``, ``cap_sweep`` and
``bucket_lower_bound``: the argument for buckets of a few MB. A timeline measured in a real run
is ``tracing.ddp_run.measured_timeline``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import vi
from .buckets import Bucket, Param, assign_buckets, cap_limits
from .checks import int_at_least, non_negative, one_of
from .costs import alpha_beta_time

# Alpha-beta defaults, calibrated on this 2-core machine with each operation run ALONE: gloo
# all-reduces 4 bytes between 2 ranks in ~110 us (= 2 alpha) and 0.54 MB in ~0.65 ms
# (~1 GB/s); the demo model's backward at batch 128 takes ~1.4 ms (~50 GFLOP/s). At these
# numbers communication and compute are of the same order, the regime where buckets matter.
DEFAULT_ALPHA = 50e-6  # s per message step
DEFAULT_BANDWIDTH = 1e9  # bytes/s
DEFAULT_FLOPS = 50e9  # FLOP/s of the backward pass, per rank
DEFAULT_WORLD_SIZE = 2
DEFAULT_BATCH = 128  # the demo batch, of the real run and of the alpha-beta model alike
LAYOUT_KINDS = ("rebuilt", "initial")  # DDP's layout after the rebuild / in its first iteration


@dataclass(frozen=True)
class LayerSpan:
    """The backward computation of one layer; its gradients are ready at ``end``."""

    name: str
    start: float
    end: float
    params: tuple[int, ...]


@dataclass(frozen=True)
class CommSpan:
    """One bucket's AllReduce: ready (last gradient in), started, finished."""

    bucket: int
    ready: float
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Everything one figure needs. ``source`` is ``alpha-beta`` or ``measured``; ``label`` says
    it in Vietnamese on the figure. Times in seconds from the start of ``backward()``."""

    source: str
    label: str
    params: tuple[Param, ...]
    buckets: tuple[Bucket, ...]
    layers: tuple[LayerSpan, ...]
    comms: tuple[CommSpan, ...]
    param_ready: tuple[float, ...]
    compute_end: float
    total: float
    baseline_total: float  # backward, then one AllReduce of every gradient
    caps: tuple[int, int]
    baseline_compute_end: float | None = None  # None: the same backward as above
    layout: str = "rebuilt"  # "rebuilt": packed in ready order; "initial": DDP's first iteration


def layer_times(params: Sequence[Param], order: Sequence[int], batch: int = DEFAULT_BATCH,
                flops: float = DEFAULT_FLOPS) -> list[tuple[str, float, tuple[int, ...]]]:
    """Layers in backward order with their compute time: ``4 * batch * parameters / flops``.

    Why 4: a Linear layer's backward is two matrix products (gradient of the input and of the
    weight), each ``2 * batch * in * out`` FLOP. Layers without matmuls (LayerNorm) get the same
    rule, i.e. almost nothing; the first layer's unneeded input gradient is counted anyway.
    """
    int_at_least("batch", batch)
    if not flops > 0:
        raise ValueError(f"flops phải dương, nhận được {flops!r}.")
    groups: dict[str, list[int]] = {}
    for i in order:
        groups.setdefault(params[i].layer, []).append(i)
    return [(name, 4 * batch * sum(params[i].numel for i in ix) / flops, tuple(ix))
            for name, ix in groups.items()]


def _serialise(buckets: Sequence[Bucket], ready: Sequence[float], world_size: int, alpha: float,
               bandwidth: float) -> list[CommSpan]:
    """One link: bucket k starts when it is ready and bucket k-1 is done (DDP launches in index
    order, and one process group runs its collectives one after another)."""
    spans, free = [], 0.0
    for b in buckets:
        r = max(ready[i] for i in b.params)
        start = max(r, free)
        free = start + alpha_beta_time("all_reduce", b.nbytes, world_size, alpha, bandwidth)
        spans.append(CommSpan(b.index, r, start, free))
    return spans


def alpha_beta_timeline(params: Sequence[Param], limits: Sequence[int], order: Sequence[int], *,
                        world_size: int = DEFAULT_WORLD_SIZE, alpha: float = DEFAULT_ALPHA,
                        bandwidth: float = DEFAULT_BANDWIDTH, batch: int = DEFAULT_BATCH,
                        flops: float = DEFAULT_FLOPS, last_small: bool = False,
                        layout: Sequence[Bucket] | None = None,
                        layout_kind: str = "rebuilt") -> Timeline:
    """Backward layer after layer in the gradient-ready ``order`` (each layer's gradients ready
    at its end), buckets from ``assign_buckets`` on that order, i.e. DDP's layout after the
    rebuild (``last_small``: as DDP rebuilds them under ``DDP_SET_LAST_BUCKET_CAP=1``), or the
    given ``layout`` (e.g. ``buckets.initial_buckets``, the first iteration's), AllReduces timed
    by ``costs.alpha_beta_time`` and serialised in bucket order. ``layout_kind`` says which
    layout it is, for the labels: ``"rebuilt"`` or ``"initial"`` (``LAYOUT_KINDS``).

    The model assumes perfect overlap: an AllReduce running beside the backward does not slow
    it down. On a GPU, NCCL's kernels take SMs and memory bandwidth from the compute kernels
    they overlap; the model leaves that out."""
    int_at_least("world_size", world_size, 2)
    non_negative("alpha", alpha)
    one_of("layout_kind", layout_kind, LAYOUT_KINDS)
    order = list(order)
    if layout is None:
        buckets = assign_buckets(params, limits, order, last_small=last_small)
    else:
        buckets = list(layout)
        if sorted(i for b in buckets for i in b.params) != list(range(len(params))):
            raise ValueError("layout phải chứa mỗi chỉ số tham số 0..n-1 đúng một lần.")
    layers, ready, t = [], [0.0] * len(params), 0.0
    for name, dt, ix in layer_times(params, order, batch, flops):
        layers.append(LayerSpan(name, t, t + dt, ix))
        t += dt
        for i in ix:
            ready[i] = t
    comms = _serialise(buckets, ready, world_size, alpha, bandwidth)
    total_bytes = sum(p.nbytes for p in params)
    baseline = t + alpha_beta_time("all_reduce", total_bytes, world_size, alpha, bandwidth)
    label = (f"Thời gian: mô hình alpha-beta (α = {vi.number(alpha * 1e6, 0)} µs, băng thông "
             f"{vi.number(bandwidth / 1e9, 2)} GB/s, N = {world_size}; tính toán ∝ số tham số, "
             f"{vi.number(flops / 1e9, 1)} GFLOP/s)")
    return Timeline("alpha-beta", label, tuple(params), tuple(buckets), tuple(layers),
                    tuple(comms), tuple(ready), t, max(t, comms[-1].end), baseline,
                    (limits[0], limits[-1]), layout=layout_kind)


@dataclass(frozen=True)
class Comparison:
    """Alpha-beta step time of three ways to synchronise gradients, and their AllReduce counts."""

    per_param: float
    buckets: float
    no_overlap: float
    n_per_param: int
    n_buckets: int
    cap: int  # bytes, the bucket cap of (b)
    label: str  # the alpha-beta constants, for the figure

    @property
    def best(self) -> str:
        return min(("per_param", "buckets", "no_overlap"), key=lambda k: getattr(self, k))


def compare_strategies(params: Sequence[Param], limits: Sequence[int], order: Sequence[int],
                       **model) -> Comparison:
    """(a) one AllReduce per parameter (a 1-byte cap closes a bucket at every tensor),
    (b) DDP's buckets with ``limits``, (c) one AllReduce after the whole backward (the
    no-overlap baseline). ``model``: keyword arguments of ``alpha_beta_timeline``."""
    per = alpha_beta_timeline(params, [1], order, **model)
    buck = alpha_beta_timeline(params, limits, order, **model)
    return Comparison(per.total, buck.total, buck.baseline_total, len(per.buckets),
                      len(buck.buckets), limits[-1], buck.label)


def _check(world_size: int, alpha: float, bandwidth: float) -> None:
    int_at_least("world_size", world_size, 2)
    non_negative("alpha", alpha)
    if not bandwidth > 0:
        raise ValueError(f"bandwidth phải dương, nhận được {bandwidth!r}.")


def half_size(world_size: int = DEFAULT_WORLD_SIZE, alpha: float = DEFAULT_ALPHA,
              bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """Bytes ``n`` for which ``2(N-1) alpha == 2(N-1)/N * n / bandwidth``: ``N alpha bandwidth``."""
    _check(world_size, alpha, bandwidth)
    return world_size * alpha * bandwidth


def transfer_share(nbytes: float, world_size: int = DEFAULT_WORLD_SIZE,
                   alpha: float = DEFAULT_ALPHA, bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """Fraction of a ring AllReduce of ``nbytes`` spent moving bytes (the rest is latency)."""
    non_negative("nbytes", nbytes)
    n_half = half_size(world_size, alpha, bandwidth)
    return nbytes / (nbytes + n_half) if nbytes + n_half > 0 else 0.0


def bucket_lower_bound(tl: Timeline, world_size: int = DEFAULT_WORLD_SIZE,
                       alpha: float = DEFAULT_ALPHA,
                       bandwidth: float = DEFAULT_BANDWIDTH) -> float:
    """``max(T_compute + T_AR(last bucket), sum_k T_AR(bucket k))`` for the timeline ``tl``."""
    _check(world_size, alpha, bandwidth)
    t = [alpha_beta_time("all_reduce", b.nbytes, world_size, alpha, bandwidth)
         for b in tl.buckets]
    return max(tl.compute_end + t[-1], sum(t))


def cap_sweep(params: Sequence[Param], order: Sequence[int], caps_mb: Sequence[float],
              **model) -> list[tuple[float, int, float]]:
    """``(cap in MiB, number of buckets, alpha-beta step time in s)`` for each cap (the first
    bucket's cap equal to it, as when ``bucket_cap_mb`` is passed to DDP)."""
    out = []
    for cap in caps_mb:
        tl = alpha_beta_timeline(params, cap_limits(cap), order, **model)
        out.append((cap, len(tl.buckets), tl.total))
    return out
