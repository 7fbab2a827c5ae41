"""DDP buckets and overlap: which gradients DDP packs together, and when each bucket's AllReduce
runs while the backward pass goes on.

What PyTorch does (read in ``torch/nn/parallel/distributed.py`` of torch 2.13 and checked against
real runs in ``tests/test_widgets_buckets.py``):

* DDP's parameter list: ``named_modules()`` in order, each module's own parameters that require
  a gradient, shared parameters once (``_build_params_for_reducer``).
* Caps (``_BucketCapacityConfig.create``): ``bucket_cap_mb=None`` means 25 MiB
  (``_DEFAULT_BUCKET_CAP_MB``) *and* a first bucket of 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``);
  an explicit ``bucket_cap_mb`` makes the first cap equal to it. There is no
  ``first_bucket_cap_mb`` argument; ``bucket_cap_mb_list=[first, cap]`` (new in 2.x) sets both.
  MB here means MiB: ``int(cap_mb * 1024 * 1024)`` bytes.
* First iteration: with the defaults (``find_unused_parameters=False``) every parameter sits in
  ONE bucket. During that backward the reducer records the order in which gradients become
  ready, and afterwards rebuilds the buckets with ``_compute_bucket_assignment_by_size`` on that
  order with the limits ``[first cap, cap]``. For a layer stack the order is close to the reverse
  of registration, but not equal to it (LayerNorm's weight is ready before its bias).
* The packing (``compute_bucket_assignment_by_size`` in ``reducer.cpp``): one open bucket per
  (dtype, device); add the tensor, and close the bucket as soon as its size is >= the current
  limit, so the tensor that crosses the cap stays in it; each (dtype, device) then moves to the
  next limit (the first cap is used once). Sparse gradients get a bucket of their own.
* The reducer launches buckets strictly in index order, each as soon as all its gradients (and
  all earlier buckets) are ready; ``backward()`` returns after every bucket's future completed.

Times come from one of two sources, and every figure says which: the alpha-beta model
(``costs.alpha_beta_time``, compute proportional to parameter count) or a trace recorded in a
real 2-rank gloo run on this machine (``measure``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..checks import int_at_least, non_negative, one_of
from ..costs import alpha_beta_time
from .player import Frame, Player
from .svg import PALETTE, Svg

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25  # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
DEFAULT_FIRST_BUCKET_MB = 1  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES / MiB
SPARSE_LIMIT = 0  # what torch reports as the limit of a sparse gradient's own bucket

# Alpha-beta defaults, calibrated on this 2-core machine with each operation run ALONE: gloo
# all-reduces 4 bytes between 2 ranks in ~110 us (= 2 alpha) and 0.54 MB in ~0.65 ms
# (~1 GB/s); the demo model's backward at batch 128 takes ~1.4 ms (~50 GFLOP/s). At these
# numbers communication and compute are of the same order, the regime where buckets matter.
DEFAULT_ALPHA = 50e-6  # s per message step
DEFAULT_BANDWIDTH = 1e9  # bytes/s
DEFAULT_FLOPS = 50e9  # FLOP/s of the backward pass, per rank
DEFAULT_BATCH = 128
BASELINE_CAP_MB = 1000.0  # larger than the demo model: one bucket
DEFAULT_WORLD_SIZE = 2
CAP_CHOICES_MB = (0.02, 0.05, 0.1, 0.2, 0.5)
FIRST_CAP_CHOICES_MB = (0.01, 0.02, 0.05, 0.1)
SOURCES = ("alpha-beta", "measured")
_BUCKET_COLOURS = ("sky", "orange", "green", "purple", "yellow", "vermillion", "blue")


# --------------------------------------------------------------------------------------------
# The demo model: a small Transformer-ish stack whose layers differ in size, so that small caps
# give several buckets, and whose LayerNorms show that DDP follows the gradient-ready order.

D_IN = 32  # input features of the demo model


class Block(nn.Module):
    """Pre-norm residual MLP block: LayerNorm, Linear d->h, ReLU, Linear h->d."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class BucketNet(nn.Module):
    """``inp`` (32->64), three blocks with hidden widths 128, 256, 512, and a wide ``head``
    (64->256, like a small vocabulary) whose gradient is ready first."""

    def __init__(self, d_in: int = D_IN, d: int = 64, hidden=(128, 256, 512), d_out: int = 256):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        for i, h in enumerate(hidden):
            self.add_module(f"b{i}", Block(d, h))
        self.n_blocks = len(hidden)
        self.head = nn.Linear(d, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i in range(self.n_blocks):
            x = getattr(self, f"b{i}")(x)
        return self.head(x)


def build_model(seed: int = 0) -> BucketNet:
    """The demo model with weights fixed by ``seed`` (identical on every rank)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return BucketNet()
    finally:
        torch.random.set_rng_state(state)


# --------------------------------------------------------------------------------------------
# Bucket assignment (pure)

@dataclass(frozen=True)
class Param:
    """One parameter as DDP's reducer sees it: size, dtype, device, and the layer it belongs to."""

    name: str
    layer: str
    numel: int
    dtype: str = "float32"
    device: str = "cpu"
    sparse: bool = False

    @property
    def nbytes(self) -> int:
        return self.numel * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True)
class Bucket:
    """One bucket: indices into the parameter list (in the order they were packed), bytes, and
    the limit that was in force when it was built (as torch returns it)."""

    index: int
    params: tuple[int, ...]
    nbytes: int
    limit: int


def _ddp_named_params(model: nn.Module):
    """``(module name, module, parameter name, parameter)`` in DDP's order: ``named_modules()``,
    each module's own parameters; frozen ones left out, shared ones once."""
    seen = set()
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                yield mod_name, mod, p_name, p


def model_params(model: nn.Module) -> list[Param]:
    """The parameters of ``model`` as DDP's reducer lists them (``_build_params_for_reducer``)."""
    out = []
    for mod_name, mod, p_name, p in _ddp_named_params(model):
        sparse = isinstance(mod, (nn.Embedding, nn.EmbeddingBag)) and mod.sparse
        out.append(Param(f"{mod_name}.{p_name}" if mod_name else p_name, mod_name or "(gốc)",
                         p.numel(), str(p.dtype).removeprefix("torch."), p.device.type, sparse))
    return out


def ready_order(model: nn.Module, example: torch.Tensor) -> list[int]:
    """Indices (into ``model_params``) in the order their gradients become ready in one
    backward pass on ``example``: the order DDP records in its first iteration and rebuilds
    its buckets from."""
    tensors = [p for *_, p in _ddp_named_params(model)]
    index = {id(p): i for i, p in enumerate(tensors)}
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda t: order.append(index[id(t)]))
               for p in tensors]
    try:
        model(example).sum().backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    return order


def cap_limits(bucket_cap_mb: float | None = None,
               first_bucket_cap_mb: float | None = None) -> list[int]:
    """The byte limits DDP packs with, ``[first cap, cap]``, from the user's settings.

    ``bucket_cap_mb=None``: DDP's defaults, 1 MiB then 25 MiB. A given ``bucket_cap_mb`` with
    ``first_bucket_cap_mb=None``: the first cap equals the cap (DDP drops the small first bucket
    when the cap is set explicitly). Both given: ``bucket_cap_mb_list=[first, cap]`` in DDP.
    """
    for name, value in (("bucket_cap_mb", bucket_cap_mb),
                        ("first_bucket_cap_mb", first_bucket_cap_mb)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or value <= 0):
            raise ValueError(f"{name} phải là số MB dương hoặc None (mặc định của DDP), "
                             f"nhận được {value!r}.")
    cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MIB)
    if first_bucket_cap_mb is not None:
        first = int(first_bucket_cap_mb * MIB)
    else:
        first = DEFAULT_FIRST_BUCKET_MB * MIB if bucket_cap_mb is None else cap
    if min(first, cap) < 1:
        raise ValueError("bucket_cap_mb và first_bucket_cap_mb phải ứng với ít nhất 1 byte.")
    return [first, cap]


def assign_buckets(params: Sequence[Param], limits: Sequence[int],
                   order: Sequence[int] | None = None) -> list[Bucket]:
    """PyTorch's ``compute_bucket_assignment_by_size``: walk ``order`` (default: reverse
    registration, the order DDP assumes for a plain stack of layers), one open bucket per
    (dtype, device), closed once its bytes reach the current limit, then the next limit.

    Buckets come out in closing order, then the still-open ones, one per (dtype, device) in the
    order those first appeared; PyTorch orders such leftovers through a hash map, i.e. in no
    documented order, which matters only when several dtypes or devices are mixed.
    """
    if not limits or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in limits):
        raise ValueError(f"limits phải là danh sách số byte nguyên dương, nhận được {limits!r}.")
    order = list(range(len(params)))[::-1] if order is None else list(order)
    if sorted(order) != list(range(len(params))):
        raise ValueError("order phải là một hoán vị của các chỉ số tham số 0..n-1.")
    closed: list[tuple[list[int], int]] = []
    open_: dict[tuple, list] = {}  # key -> [indices, bytes, limit position]
    for i in order:
        p = params[i]
        if p.sparse:  # a sparse gradient cannot be flattened with others
            closed.append(([i], SPARSE_LIMIT))
            continue
        acc = open_.setdefault((p.dtype, p.device), [[], 0, 0])
        acc[0].append(i)
        acc[1] += p.nbytes
        limit = limits[acc[2]]
        if acc[1] >= limit:
            closed.append((acc[0], limit))
            acc[:] = [[], 0, min(acc[2] + 1, len(limits) - 1)]
    closed += [(a[0], limits[a[2]]) for a in open_.values() if a[0]]
    return [Bucket(k, tuple(ix), sum(params[i].nbytes for i in ix), lim)
            for k, (ix, lim) in enumerate(closed)]


# --------------------------------------------------------------------------------------------
# Timelines (pure): the same data for the alpha-beta model and for a measured trace

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


def alpha_beta_timeline(params: Sequence[Param], limits: Sequence[int],
                        order: Sequence[int] | None = None, *, world_size: int = DEFAULT_WORLD_SIZE,
                        alpha: float = DEFAULT_ALPHA, bandwidth: float = DEFAULT_BANDWIDTH,
                        batch: int = DEFAULT_BATCH, flops: float = DEFAULT_FLOPS) -> Timeline:
    """Backward layer after layer (each layer's gradients ready at its end), buckets from
    ``assign_buckets``, AllReduces timed by ``costs.alpha_beta_time`` and serialised."""
    int_at_least("world_size", world_size, 2)
    non_negative("alpha", alpha)
    order = list(range(len(params)))[::-1] if order is None else list(order)
    buckets = assign_buckets(params, limits, order)
    layers, ready, t = [], [0.0] * len(params), 0.0
    for name, dt, ix in layer_times(params, order, batch, flops):
        layers.append(LayerSpan(name, t, t + dt, ix))
        t += dt
        for i in ix:
            ready[i] = t
    comms = _serialise(buckets, ready, world_size, alpha, bandwidth)
    total_bytes = sum(p.nbytes for p in params)
    baseline = t + alpha_beta_time("all_reduce", total_bytes, world_size, alpha, bandwidth)
    label = (f"Thời gian: mô hình alpha-beta (α = {_num(alpha * 1e6, 0)} µs, băng thông "
             f"{_num(bandwidth / 1e9, 2)} GB/s, N = {world_size}; tính toán ∝ số tham số, "
             f"{_num(flops / 1e9, 1)} GFLOP/s)")
    return Timeline("alpha-beta", label, tuple(params), tuple(buckets), tuple(layers),
                    tuple(comms), tuple(ready), t, max(t, comms[-1].end), baseline,
                    (limits[0], limits[-1]))


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


def compare_strategies(params: Sequence[Param], limits: Sequence[int],
                       order: Sequence[int] | None = None, **model) -> Comparison:
    """(a) one AllReduce per parameter (a 1-byte cap closes a bucket at every tensor),
    (b) DDP's buckets with ``limits``, (c) one AllReduce after the whole backward (the
    no-overlap baseline). ``model``: keyword arguments of ``alpha_beta_timeline``."""
    per = alpha_beta_timeline(params, [1], order, **model)
    buck = alpha_beta_timeline(params, limits, order, **model)
    return Comparison(per.total, buck.total, buck.baseline_total, len(per.buckets),
                      len(buck.buckets), limits[-1], buck.label)


# --------------------------------------------------------------------------------------------
# Frames (pure)

BucketStatus = str  # "empty", "filling", "waiting", "reducing", "done"


@dataclass(frozen=True)
class StepFrame:
    """The state at time ``now``: after layer ``layer`` (None: before backward; the last frame
    has ``final=True`` and ``now = total``)."""

    timeline: Timeline
    now: float
    layer: str | None
    filled: tuple[int, ...]  # bytes of each bucket whose gradient is ready
    status: tuple[BucketStatus, ...]
    caption: str
    final: bool


_EPS = 1e-12


def bucket_status(tl: Timeline, now: float) -> tuple[tuple[int, ...], tuple[BucketStatus, ...]]:
    """Bytes ready and status of each bucket at ``now``."""
    filled, status = [], []
    for b, c in zip(tl.buckets, tl.comms):
        f = sum(tl.params[i].nbytes for i in b.params if tl.param_ready[i] <= now + _EPS)
        filled.append(f)
        if c.end <= now + _EPS:
            status.append("done")
        elif c.start <= now + _EPS:
            status.append("reducing")
        elif f == b.nbytes:
            status.append("waiting")
        else:
            status.append("filling" if f else "empty")
    return tuple(filled), tuple(status)


def build_frames(tl: Timeline) -> list[StepFrame]:
    """One frame before backward, one per layer whose gradients become ready, and a last frame
    with the whole timeline and the no-overlap baseline."""
    frames = [_frame(tl, 0.0, None, "Trước backward: các bucket còn trống. "
                     f"{len(tl.buckets)} bucket, xếp theo thứ tự gradient sẵn sàng "
                     "(tầng cuối của lượt truyền xuôi có gradient trước).")]
    prev = 0.0
    for span in tl.layers:
        frames.append(_frame(tl, span.end, span.name, _layer_caption(tl, span, prev)))
        prev = span.end
    return frames + [_frame(tl, tl.total, None, _final_caption(tl), final=True)]


def _frame(tl, now, layer, caption, final=False) -> StepFrame:
    filled, status = bucket_status(tl, now)
    return StepFrame(tl, now, layer, filled, status, caption, final)


def _layer_caption(tl: Timeline, span: LayerSpan, prev: float) -> str:
    where = sorted({k for k, b in enumerate(tl.buckets) for i in b.params if i in span.params})
    kb = sum(tl.params[i].nbytes for i in span.params) / 1024
    text = (f"t = {_ms(span.end)}: tầng {span.name} tính xong gradient ({len(span.params)} "
            f"tensor tham số, {_num(kb, 1)} KiB) → vào bucket "
            f"{', '.join(f'B{k}' for k in where)}.")
    full = [c for c in tl.comms if prev + _EPS < c.ready <= span.end + _EPS]
    for c in full:
        if tl.source == "measured":
            text += (f" B{c.bucket} đủ gradient; DDP gọi comm hook (phát AllReduce) lúc "
                     f"{_ms(c.start)}.")
        elif c.start <= c.ready + _EPS:
            text += f" B{c.bucket} đủ gradient: AllReduce bắt đầu ngay."
        else:
            text += (f" B{c.bucket} đủ gradient nhưng chờ AllReduce trước xong (bắt đầu lúc "
                     f"{_ms(c.start)}).")
    running = [c.bucket for c in tl.comms if c.start < span.end - _EPS < c.end - 2 * _EPS]
    if running and span is not tl.layers[-1]:
        text += (f" Trong lúc backward tiếp tục, AllReduce của "
                 f"{', '.join(f'B{k}' for k in running)} chạy song song (chồng lấp).")
    return text


def _final_caption(tl: Timeline) -> str:
    gain = tl.baseline_total - tl.total
    return (f"Toàn bộ: backward tính xong lúc {_ms(tl.compute_end)}, cả bước (kể cả mọi "
            f"AllReduce) xong lúc {_ms(tl.total)}. Không chồng lấp (một AllReduce sau backward): "
            f"{_ms(tl.baseline_total)}. Chồng lấp "
            + (f"tiết kiệm {_ms(gain)} ({_num(100 * gain / tl.baseline_total, 0)}%)."
               if gain > 0 else f"không có lợi ở đây (chậm hơn {_ms(-gain)})."))


# --------------------------------------------------------------------------------------------
# Renderer

W, H = 1000, 600
X0, X1 = 185, 975  # time axis
Y_BUCKETS, Y_COMP, Y_COMM, Y_BASE, Y_AXIS = 96, 228, 318, 398, 470


def bucket_colour(k: int) -> str:
    return PALETTE[_BUCKET_COLOURS[k % len(_BUCKET_COLOURS)]]


def _ink(k: int) -> str:
    """Text colour on a bucket's fill: white only on the dark blue."""
    return "#FFFFFF" if _BUCKET_COLOURS[k % len(_BUCKET_COLOURS)] == "blue" else "#111111"


def render_frame(fr: StepFrame) -> str:
    tl = fr.timeline
    s = Svg(W, H, "Bucket của DDP và chồng lấp giao tiếp với backward")
    cap, first = tl.caps[1] / MIB, tl.caps[0] / MIB
    s.text(20, 26, f"DDP: bucket_cap_mb = {_num(cap, 2)} MiB, bucket đầu {_num(first, 2)} MiB",
           cls="t-big", anchor="start", weight="bold")
    colour = PALETTE["sky"] if tl.source == "alpha-beta" else PALETTE["orange"]
    s.rect(14, 42, 972, 28, fill=colour, stroke=colour, opacity=0.25)
    s.text(22, 57, tl.label, cls="t-small", anchor="start")
    _draw_buckets(s, fr)
    _draw_timeline(s, fr)
    _draw_summary(s, fr)
    return s.render()


def _fits(text: str, width: float, px: float = 11.0) -> bool:
    """Conservative: ``px`` per character is about presentation mode's 18 px small text."""
    return len(text) * px <= width - 6


def _draw_buckets(s: Svg, fr: StepFrame) -> None:
    tl = fr.timeline
    s.text(20, Y_BUCKETS - 8, "Bucket theo thứ tự AllReduce (phần tô = gradient đã sẵn sàng):",
           cls="t", anchor="start")
    words = {"empty": "trống", "filling": "đang gom", "waiting": "chờ", "reducing": "AllReduce",
             "done": "✓ xong"}
    for k, (x, w) in enumerate(_widths([b.nbytes for b in tl.buckets], 20, 980)):
        b, st, col = tl.buckets[k], fr.status[k], bucket_colour(k)
        frac = fr.filled[k] / b.nbytes if b.nbytes else 1.0
        strong = st in ("reducing", "done")
        s.rect(x, Y_BUCKETS + 4, w, 52, fill="#FFFFFF", stroke=col if frac else PALETTE["grey"])
        if frac:
            s.rect(x, Y_BUCKETS + 4, w * frac, 52, fill=col, stroke=col,
                   opacity=1.0 if strong else 0.45)
        ink = _ink(k) if strong else "#111111"
        head = next((t for t in (f"B{k} · {_kib(b.nbytes)}", f"B{k}") if _fits(t, w)), None)
        if head:
            s.text(x + w / 2, Y_BUCKETS + 20, head, cls="t-small", fill=ink)
        if _fits(words[st], w):
            s.text(x + w / 2, Y_BUCKETS + 42, words[st], cls="t-small", fill=ink)
        names = [tl.params[i].layer for i in b.params]
        span = names[0] if names[0] == names[-1] else f"{names[0]} → {names[-1]}"
        if _fits(span, w):  # which layers the bucket holds, in the order they arrive
            s.text(x + w / 2, Y_BUCKETS + 74, span, cls="t-small", fill="#333333")


def _widths(sizes: Sequence[int], left: float, right: float, gap: float = 4.0):
    """Boxes proportional to bytes, with a floor so that a 1 KiB bucket stays visible."""
    n = len(sizes)
    avail = right - left - gap * (n - 1)
    floor = min(56.0, 0.6 * avail / n)
    total = sum(sizes) or 1
    x = left
    for size in sizes:
        w = floor + (avail - floor * n) * size / total
        yield x, w
        x += w + gap


def _draw_timeline(s: Svg, fr: StepFrame) -> None:
    tl = fr.timeline
    scale = _scale(tl)
    for y, text in ((Y_COMP + 20, "Backward"), (Y_COMM + 20, "AllReduce")):
        s.text(15, y, text, cls="t", anchor="start", weight="bold")
    if tl.source == "measured":
        s.text(15, Y_COMM + 42, "(phát → xong)", cls="t-small", anchor="start")
    base_ink = "#111111" if fr.final else PALETTE["grey"]  # filled in on the last frame
    s.text(15, Y_BASE + 7, "Không", cls="t", anchor="start", weight="bold", fill=base_ink)
    s.text(15, Y_BASE + 33, "chồng lấp", cls="t", anchor="start", weight="bold", fill=base_ink)
    owner = {i: k for k, b in enumerate(tl.buckets) for i in b.params}
    for span in tl.layers:
        _draw_layer(s, span, scale, owner, tl, done=span.end <= fr.now + _EPS)
    rows, h = _comm_rows(tl)
    for k, c in enumerate(tl.comms):
        _draw_comm(s, c, scale, fr.now, Y_COMM + (k % rows) * h, h * 0.9 if rows > 1 else h)
    if fr.final:
        _draw_baseline(s, tl, scale)
    _draw_axis(s, tl, scale)
    x = scale(fr.now)
    s.line(x, Y_COMP - 16, x, Y_AXIS, stroke=PALETTE["black"], dash="6 4")
    label = f"t = {_ms(fr.now)}"
    s.text(min(max(x, X0 + 60), X1 - 60), Y_COMP - 26, label, cls="t-small", weight="bold")


def _draw_layer(s, span, scale, owner, tl, done) -> None:
    x, w = scale(span.start), max(1.5, scale(span.end) - scale(span.start))
    s.rect(x, Y_COMP, w, 40, fill=PALETTE["light"] if done else "#FFFFFF",
           stroke=PALETTE["black"] if done else PALETTE["grey"], rx=2)
    if _fits(span.name, w, 9.5):
        s.text(x + w / 2, Y_COMP + 20, span.name, cls="t-small",
               fill="#111111" if done else "#666666")
    nb = sum(tl.params[i].nbytes for i in span.params) or 1
    px = x
    for i in span.params:  # the strip under the bar: which bucket each gradient goes to
        pw = w * tl.params[i].nbytes / nb
        if done:
            s.rect(px, Y_COMP + 44, pw, 12, fill=bucket_colour(owner[i]), stroke="none", rx=0)
        px += pw


def _draw_comm(s, c: CommSpan, scale, now: float, y: float, h: float) -> None:
    col = bucket_colour(c.bucket)
    if c.ready <= now + _EPS:  # the bucket's last gradient has arrived
        xr = scale(c.ready)
        s.raw(f'<polygon points="{xr - 7:.1f},{Y_COMM - 14:.1f} {xr + 7:.1f},{Y_COMM - 14:.1f} '
              f'{xr:.1f},{Y_COMM - 2:.1f}" fill="{col}" stroke="#333333" stroke-width="1"/>')
        if c.start > c.ready + _EPS:  # waiting for the link (model) or for the reducer (run)
            s.line(xr, y + h / 2, scale(min(c.start, now)), y + h / 2, stroke=col, dash="3 3")
    if c.start > now + _EPS:
        return
    x, xe, xn = scale(c.start), scale(c.end), scale(min(c.end, now))
    s.rect(x, y, max(1.5, xe - x), h, fill="#FFFFFF", stroke=col, rx=2)
    s.rect(x, y, max(1.5, xn - x), h, fill=col, stroke=col, rx=2)
    label = f"B{c.bucket}"
    if h >= 18 and _fits(label, xe - x, 10):
        s.text((x + xe) / 2, y + h / 2, label, cls="t-small",
               fill=_ink(c.bucket) if xn >= xe - 1 else "#111111")


def _comm_rows(tl: Timeline) -> tuple[int, float]:
    """The model serialises AllReduces on one row; a measured run may overlap them (gloo runs
    queued work on several threads), so each bucket gets its own thin row there."""
    if tl.source == "alpha-beta":
        return 1, 40.0
    n = len(tl.comms)
    return n, min(40.0, 64.0 / n)


def _draw_baseline(s, tl: Timeline, scale) -> None:
    end = tl.compute_end if tl.baseline_compute_end is None else tl.baseline_compute_end
    xc, xe = scale(end), scale(tl.baseline_total)
    s.rect(X0, Y_BASE, xc - X0, 40, fill=PALETTE["light"], stroke=PALETTE["black"], rx=2)
    s.text((X0 + xc) / 2, Y_BASE + 20, "backward", cls="t-small")
    s.rect(xc, Y_BASE, max(1.5, xe - xc), 40, fill=PALETTE["vermillion"],
           stroke=PALETTE["vermillion"], rx=2)
    xl = max(xc, scale(tl.total) + 4)  # keep the label clear of the green "total" line
    if _fits("AllReduce", xe - xl, 10):
        s.text((xl + xe) / 2, Y_BASE + 20, "AllReduce", cls="t-small")
    for x, colour in ((scale(tl.total), PALETTE["green"]), (xe, PALETTE["vermillion"])):
        s.line(x, Y_COMP - 4, x, Y_AXIS, stroke=colour, cls="stroke arrow")


def _draw_axis(s, tl: Timeline, scale) -> None:
    s.line(X0, Y_AXIS, X1, Y_AXIS)
    span = _axis_end(tl)
    step = _nice_step(span / 6)
    t = 0.0
    while t <= span * 1.0001:
        x = scale(t)
        s.line(x, Y_AXIS, x, Y_AXIS + 6)
        s.text(x, Y_AXIS + 20, _num(t * 1e3, _decimals(step * 1e3)), cls="t-small")
        t += step
    s.text((X0 + X1) / 2, Y_AXIS + 44, "thời gian từ lúc bắt đầu backward (ms)", cls="t-small")


def _draw_summary(s, fr: StepFrame) -> None:
    tl = fr.timeline
    y = Y_AXIS + 80
    if not fr.final:
        s.text(20, y, f"{len(tl.buckets)} bucket · {len(tl.layers)} tầng · tổng gradient "
               f"{_kib(sum(p.nbytes for p in tl.params))} · ▼ = bucket đủ gradient",
               cls="t", anchor="start")
        return
    gain = tl.baseline_total - tl.total
    s.text(20, y, f"Có chồng lấp: {_ms(tl.total)}", cls="t", anchor="start", weight="bold",
           fill=PALETTE["green"])
    s.text(330, y, f"Không chồng lấp: {_ms(tl.baseline_total)}", cls="t", anchor="start",
           weight="bold", fill=PALETTE["vermillion"])
    word = "Nhanh hơn" if gain >= 0 else "Chậm hơn"
    s.text(680, y, f"{word}: {_ms(abs(gain))} ({_num(100 * abs(gain) / tl.baseline_total, 0)}%)",
           cls="t", anchor="start", weight="bold")


def _axis_end(tl: Timeline) -> float:
    return max(tl.total, tl.baseline_total) * 1.03


def _scale(tl: Timeline):
    end = _axis_end(tl)
    return lambda t: X0 + (X1 - X0) * t / end


def _nice_step(raw: float) -> float:
    import math
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _decimals(step_ms: float) -> int:
    return 0 if step_ms >= 1 else (1 if step_ms >= 0.1 else 2)


def _num(x: float, d: int) -> str:
    """Vietnamese number: decimal comma."""
    return f"{x:.{d}f}".replace(".", ",")


def _ms(t: float) -> str:
    return f"{_num(t * 1e3, 2)} ms"


def _kib(n: int) -> str:
    return f"{_num(n / 1024, 1)} KiB"


# --------------------------------------------------------------------------------------------
# Players and live controls

@functools.lru_cache(maxsize=1)
def demo_params() -> tuple[tuple[Param, ...], tuple[int, ...]]:
    """The demo model's parameters and their gradient-ready order (one CPU backward, cached)."""
    model = build_model()
    return tuple(model_params(model)), tuple(ready_order(model, torch.randn(4, D_IN)))


def player_for(tl: Timeline, presentation: bool = False) -> Player:
    frames = [Frame(render_frame(f), f.caption) for f in build_frames(tl)]
    title = ("Bucket của DDP và chồng lấp — "
             + ("mô hình alpha-beta" if tl.source == "alpha-beta" else "đo trên máy này"))
    return Player(frames, title=title, presentation=presentation)


def build_player(bucket_cap_mb: float | None = 0.1, first_bucket_cap_mb: float | None = None,
                 source: str = "alpha-beta", *, traces: dict | None = None,
                 alpha_us: float = DEFAULT_ALPHA * 1e6,
                 bandwidth_gbs: float = DEFAULT_BANDWIDTH / 1e9,
                 world_size: int = DEFAULT_WORLD_SIZE, batch: int = DEFAULT_BATCH,
                 presentation: bool = False) -> Player:
    """The player for the demo model. ``source="measured"`` needs ``traces`` from ``measure``
    holding this ``(bucket_cap_mb, first_bucket_cap_mb)``."""
    one_of("source", source, SOURCES)
    limits = cap_limits(bucket_cap_mb, first_bucket_cap_mb)
    if source == "measured":
        key = (bucket_cap_mb, first_bucket_cap_mb)
        if not traces or key not in traces:
            have = sorted(traces or {}, key=str)
            raise ValueError(f"Chưa đo cấu hình bucket_cap_mb={bucket_cap_mb}, "
                             f"first_bucket_cap_mb={first_bucket_cap_mb}; các cấu hình đã đo: "
                             f"{have or 'không có (hãy chạy measure())'}.")
        return player_for(measured_timeline(traces[key]), presentation)
    non_negative("alpha_us", alpha_us)
    if not bandwidth_gbs > 0:
        raise ValueError(f"bandwidth_gbs phải dương, nhận được {bandwidth_gbs!r}.")
    params, order = demo_params()
    tl = alpha_beta_timeline(params, limits, order, world_size=world_size, alpha=alpha_us * 1e-6,
                             bandwidth=bandwidth_gbs * 1e9, batch=batch)
    return player_for(tl, presentation)


def controls(traces: dict | None = None):
    """Live controls (need a kernel): caps, the time source (if ``traces`` is given), the
    alpha-beta constants, N, presentation mode."""
    import ipywidgets as w

    caps = [(f"{_num(c, 2)} MiB", c) for c in CAP_CHOICES_MB] + [("None (DDP: 25 MiB)", None)]
    firsts = [("= bucket_cap_mb", None)] + [(f"{_num(c, 2)} MiB", c) for c in FIRST_CAP_CHOICES_MB]
    ctl = {
        "bucket_cap_mb": w.Dropdown(options=caps, value=0.1, description="bucket_cap_mb"),
        "first_bucket_cap_mb": w.Dropdown(options=firsts, value=None, description="bucket đầu"),
        "alpha_us": w.FloatLogSlider(value=DEFAULT_ALPHA * 1e6, base=10, min=0, max=3,
                                     step=0.1, description="α (µs)"),
        "bandwidth_gbs": w.FloatLogSlider(value=DEFAULT_BANDWIDTH / 1e9, base=10, min=-1,
                                          max=2, step=0.1, description="GB/s"),
        "world_size": w.IntSlider(value=DEFAULT_WORLD_SIZE, min=2, max=64, description="N"),
        "presentation": w.Checkbox(value=False, description="trình chiếu"),
    }
    if traces:
        ctl["source"] = w.Dropdown(options=[("mô hình alpha-beta", "alpha-beta"),
                                            ("đo trên máy này", "measured")],
                                   value="alpha-beta", description="thời gian")
    return live(functools.partial(build_player, traces=traces), **ctl)


def live(build, **ctl):  # indirection so tests can import this module without ipywidgets
    from .live import live as _live
    return _live(build, **ctl)


def comparison_svg(c: Comparison) -> str:
    """Three bars: step time with one AllReduce per parameter, with buckets, without overlap."""
    s = Svg(W, 270, "So sánh ba cách đồng bộ gradient")
    s.text(20, 26, "Vì sao gom gradient thành bucket?", cls="t-big", anchor="start",
           weight="bold")
    s.text(20, 56, c.label, cls="t-small", anchor="start")
    rows = ((f"Mỗi tham số một AllReduce ({c.n_per_param} lần)", c.per_param, PALETTE["purple"]),
            (f"Bucket {_num(c.cap / MIB, 2)} MiB ({c.n_buckets} lần)", c.buckets,
             PALETTE["green"]),
            ("Một AllReduce sau backward", c.no_overlap, PALETTE["vermillion"]))
    end = max(r[1] for r in rows) * 1.2
    for k, (text, t, col) in enumerate(rows):
        y = 84 + 58 * k
        s.text(20, y + 18, text, cls="t", anchor="start")
        w = 520 * t / end
        s.rect(440, y, w, 36, fill=col, stroke=col, rx=2)
        s.text(440 + w + 8, y + 18, _ms(t), cls="t", anchor="start", weight="bold")
    return s.render()


def comparison_player(bucket_cap_mb: float | None = 0.1, presentation: bool = False,
                      **model) -> Player:
    """``compare_strategies`` on the demo model, as a one-frame player."""
    params, order = demo_params()
    c = compare_strategies(params, cap_limits(bucket_cap_mb), order, **model)
    names = {"per_param": "mỗi tham số một AllReduce", "buckets": "bucket",
             "no_overlap": "một AllReduce sau backward"}
    caption = (f"Nhanh nhất: {names[c.best]}. Mỗi AllReduce tốn một độ trễ cố định, nên "
               f"{c.n_per_param} AllReduce nhỏ cộng lại đắt; một AllReduce duy nhất thì phải "
               "chờ backward xong mới chạy. Bucket vừa ít lần gửi vừa chồng lên backward.")
    return Player([Frame(comparison_svg(c), caption)], title="So sánh ba cách đồng bộ gradient",
                  presentation=presentation)

# --------------------------------------------------------------------------------------------
# The real run: a worker for ``dpbook.launch.spawn`` and the measured timeline

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


def ddp_kwargs(bucket_cap_mb: float | None, first_bucket_cap_mb: float | None) -> dict:
    """DDP constructor arguments for the caps of ``cap_limits``."""
    if first_bucket_cap_mb is not None:
        cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        return {"bucket_cap_mb_list": [first_bucket_cap_mb, cap]}
    return {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}


class _Recorder:
    """State of the comm hook and of the gradient hooks during one backward."""

    def __init__(self, n_params: int, world_size: int):
        self.world_size, self.t0 = world_size, time.perf_counter()
        self.ready, self.order = [0.0] * n_params, []
        self.hook, self.done, self.buckets = {}, {}, {}
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


def _trace_config(rank, world_size, cap, first, batch, warmup, repeats, seed) -> dict:
    model = build_model(seed)
    ddp = nn.parallel.DistributedDataParallel(model, **ddp_kwargs(cap, first))
    tensors = [p for *_, p in _ddp_named_params(model)]
    rec = _Recorder(len(tensors), world_size)
    rec.index.update({id(p): i for i, p in enumerate(tensors)})
    for p in tensors:
        p.register_post_accumulate_grad_hook(rec.grad_ready)
    ddp.register_comm_hook(rec, _comm_hook)
    gen = torch.Generator().manual_seed(seed + rank)
    steps, first_order, first_buckets = [], None, None
    for it in range(warmup + repeats):
        total = _one_step(ddp, rec, torch.randn(batch, D_IN, generator=gen))
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
    params = tuple(model_params(build_model(seed)))
    raw = [_trace_config(rank, world_size, cap, first, batch, warmup, repeats, seed)
           for cap, first in configs]
    # The no-overlap baseline, measured with the same machinery: a cap larger than the model
    # gives one bucket, launched when the last gradient is ready.
    base = _trace_config(rank, world_size, BASELINE_CAP_MB, None, batch, warmup, repeats, seed)
    return [DdpTrace(params=params, baseline_s=base["backward_s"],
                     baseline_compute_s=max(base["ready_s"]), world_size=world_size,
                     batch=batch, **r) for r in raw]


MEASURED_CONFIGS = tuple((c, None) for c in CAP_CHOICES_MB) + ((0.1, 0.02),)


def measure(configs=MEASURED_CONFIGS, batch: int = DEFAULT_BATCH,
            world_size: int = 2, **spawn_kwargs) -> dict:
    """Run ``ddp_bucket_worker`` on ``world_size`` gloo ranks (about 3-5 s here); return rank
    0's traces keyed by ``(bucket_cap_mb, first_bucket_cap_mb)``."""
    from ..launch import spawn

    results = spawn(ddp_bucket_worker, tuple(configs), batch, world_size=world_size,
                    backend="gloo", **spawn_kwargs)
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
