"""DDP's gradient buckets: which gradients DDP packs together, and the order in which the
reducer launches their AllReduces. Pure functions; the animation is ``dpbook.widgets.ddp_buckets``,
a real run is recorded by ``dpbook.tracing.ddp_run``.

What PyTorch does (read in ``torch/nn/parallel/distributed.py`` of torch 2.13 and in the C++
reducer, ``torch/csrc/distributed/c10d/reducer.cpp``; checked against real runs in
``tests/widgets/test_ddp_buckets.py``):

* DDP's parameter list (``DistributedDataParallel._build_params_for_reducer``):
  ``named_modules()`` in order, each module's own parameters (``recurse=False``) that require a
  gradient, then duplicates dropped (a ``memo`` set), so a shared parameter keeps the place where
  it was first reached: a head tied to the embedding adds nothing, a frozen layer is absent.
* Caps (``_BucketCapacityConfig.create``): ``bucket_cap_mb=None`` means 25 MiB
  (``_DEFAULT_BUCKET_CAP_MB``) *and* a first bucket of 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``);
  an explicit ``bucket_cap_mb`` makes the first cap equal to it. There is no
  ``first_bucket_cap_mb`` argument; ``bucket_cap_mb_list=[first, cap]`` (new in 2.x) sets both.
  MB here means MiB: ``int(cap_mb * 1024 * 1024)`` bytes.
* First iteration (``_BucketCapacityConfig.compute_bucket_size_limits`` and
  ``DistributedDataParallel._ddp_init_helper``): with ``static_graph=True`` or
  ``find_unused_parameters=False`` (the default) every parameter sits in ONE bucket
  (limit ``sys.maxsize``), unless ``bucket_cap_mb_list`` is given; otherwise DDP calls
  ``dist._compute_bucket_assignment_by_size(parameters, limits, expect_sparse_gradient)`` in
  *registration* order (no ``tensor_indices``: the C++ function then sorts the buckets by the
  smallest index they hold) and hands the reducer ``list(reversed(bucket_indices))``: the list
  of buckets is reversed, each bucket keeps registration order inside. B0 therefore holds the
  parameters registered LAST, and the first limit (the small one) lands on the parameters
  registered first, i.e. on the last bucket reduced (``initial_buckets``). This is NOT a walk in
  reverse registration order: the cap is reached from the other end, so the cuts fall elsewhere.
* Rebuild (``Reducer::rebuild_buckets``, called at the start of a forward): only while
  ``should_rebuild_buckets()`` holds, ``(static_graph_ || !find_unused_parameters_) &&
  !has_rebuilt_bucket_``, so never with ``find_unused_parameters=True`` alone. It packs in the
  order in which the gradients became ready, with ``[first cap, cap]`` (or the given list): the
  small cap lands on B0, the gradients ready FIRST. With ``DDP_SET_LAST_BUCKET_CAP=1`` in the
  environment it packs the reversed order and reverses the result: the small cap lands on the
  last bucket (``assign_buckets(..., last_small=True)``). ``rebuild_step`` says in which step,
  ``step_buckets`` which layout a given step uses.
* The packing (``compute_bucket_assignment_by_size`` in ``reducer.cpp``): one open bucket per
  (dtype, device); add the tensor, and close the bucket as soon as its size is >= the current
  limit, so the tensor that crosses the cap stays in it; each (dtype, device) then moves to the
  next limit (the first cap is used once). Sparse gradients get a bucket of their own.
* The reducer launches buckets strictly in index order, each as soon as all its gradients (and
  all earlier buckets) are ready; ``backward()`` returns after every bucket's future completed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .style import MIB

DEFAULT_BUCKET_CAP_MB = 25  # torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
DEFAULT_FIRST_BUCKET_MB = 1  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES / MiB
SPARSE_LIMIT = 0  # what torch reports as the limit of a sparse gradient's own bucket


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


def ddp_named_params(model: nn.Module):
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
    for mod_name, mod, p_name, p in ddp_named_params(model):
        sparse = isinstance(mod, (nn.Embedding, nn.EmbeddingBag)) and mod.sparse
        out.append(Param(f"{mod_name}.{p_name}" if mod_name else p_name, mod_name or "(gốc)",
                         p.numel(), str(p.dtype).removeprefix("torch."), p.device.type, sparse))
    return out


def ready_order(model: nn.Module, example: torch.Tensor) -> list[int]:
    """Indices (into ``model_params``) in the order their gradients become ready in one
    backward pass on ``example``: the order DDP records in its first iteration and rebuilds
    its buckets from."""
    tensors = [p for *_, p in ddp_named_params(model)]
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


def assign_buckets(params: Sequence[Param], limits: Sequence[int], order: Sequence[int], *,
                   last_small: bool = False) -> list[Bucket]:
    """PyTorch's ``compute_bucket_assignment_by_size`` with ``tensor_indices=order``, as DDP's
    rebuild calls it: walk ``order`` (the gradient-ready order, from ``ready_order``), one open
    bucket per (dtype, device), closed once its bytes reach the current limit, then the next
    limit. There is no default order: the layout of DDP's first iteration is
    ``initial_buckets``, the one after the rebuild ``rebuilt_buckets``.

    ``last_small=True`` is the rebuild under ``DDP_SET_LAST_BUCKET_CAP=1``: walk ``order``
    backwards, then reverse the list of buckets, so the first limit (the small one) goes to the
    bucket whose gradients are ready last.

    Buckets come out in closing order, then the still-open ones, one per (dtype, device) in the
    order those first appeared; PyTorch orders such leftovers through a hash map, i.e. in no
    documented order, which matters only when several dtypes or devices are mixed.
    """
    if not limits or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in limits):
        raise ValueError(f"limits phải là danh sách số byte nguyên dương, nhận được {limits!r}.")
    if not isinstance(last_small, bool):
        raise ValueError(f"last_small phải là True hoặc False, nhận được {last_small!r}.")
    order = list(order)
    if sorted(order) != list(range(len(params))):
        raise ValueError("order phải là một hoán vị của các chỉ số tham số 0..n-1.")
    if last_small:
        packed = assign_buckets(params, limits, order[::-1])[::-1]
        return [Bucket(k, b.params, b.nbytes, b.limit) for k, b in enumerate(packed)]
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


def ddp_kwargs(bucket_cap_mb: float | None, first_bucket_cap_mb: float | None) -> dict:
    """DDP constructor arguments for the caps of ``cap_limits``."""
    if first_bucket_cap_mb is not None:
        cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        return {"bucket_cap_mb_list": [first_bucket_cap_mb, cap]}
    return {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}


@dataclass(frozen=True)
class DdpSetting:
    """The DDP arguments (and the one environment variable) that decide where the buckets fall:
    the caps of ``cap_limits``, ``find_unused_parameters``, ``static_graph``, and
    ``last_bucket_cap`` for ``DDP_SET_LAST_BUCKET_CAP=1`` in the ranks' environment."""

    bucket_cap_mb: float | None = None
    first_bucket_cap_mb: float | None = None
    find_unused_parameters: bool = False
    static_graph: bool = False
    last_bucket_cap: bool = False

    def __post_init__(self):
        cap_limits(self.bucket_cap_mb, self.first_bucket_cap_mb)  # checks the caps
        for name in ("find_unused_parameters", "static_graph", "last_bucket_cap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} phải là True hoặc False, nhận được "
                                 f"{getattr(self, name)!r}.")

    @property
    def limits(self) -> list[int]:
        return cap_limits(self.bucket_cap_mb, self.first_bucket_cap_mb)

    def kwargs(self) -> dict:
        """Keyword arguments for ``DistributedDataParallel`` (the defaults left out)."""
        out = ddp_kwargs(self.bucket_cap_mb, self.first_bucket_cap_mb)
        for name in ("find_unused_parameters", "static_graph"):
            if getattr(self, name):
                out[name] = True
        return out

    def call(self) -> str:
        """How the reader writes it: ``DDP(model, ...)``, with the environment variable."""
        text = "DDP(model" + "".join(f", {k}={v}" for k, v in self.kwargs().items()) + ")"
        return ("DDP_SET_LAST_BUCKET_CAP=1, " + text) if self.last_bucket_cap else text


def initial_limits(setting: DdpSetting) -> list[int]:
    """The limits of DDP's first-iteration packing, ``bucket_size_limits`` of
    ``_BucketCapacityConfig.compute_bucket_size_limits``: ``bucket_cap_mb_list`` as given;
    else ``[sys.maxsize]`` (one bucket) with ``static_graph=True`` or
    ``find_unused_parameters=False``; else ``[first cap, cap]``, or ``[cap]`` when the first cap
    is not smaller."""
    limits = setting.limits
    if setting.first_bucket_cap_mb is not None:
        return limits
    if setting.static_graph or not setting.find_unused_parameters:
        return [sys.maxsize]  # never reached: one bucket
    return limits if limits[0] < limits[1] else limits[1:]


def initial_buckets(params: Sequence[Param], setting: DdpSetting) -> list[Bucket]:
    """The buckets of DDP's first iteration, as ``_ddp_init_helper`` builds them: packed in
    registration order with ``initial_limits(setting)``, the buckets sorted by the smallest
    index they hold (what the C++ packing does without ``tensor_indices``; it matters only when
    dtypes or devices are mixed), then the LIST reversed, each bucket keeping registration order
    inside. With ``find_unused_parameters=True`` and no ``static_graph`` this layout is kept for
    the whole training (``rebuild_step`` is ``None``)."""
    packed = assign_buckets(params, initial_limits(setting), range(len(params)))
    packed = sorted(packed, key=lambda b: min(b.params))[::-1]
    return [Bucket(k, b.params, b.nbytes, b.limit) for k, b in enumerate(packed)]


def rebuild_step(setting: DdpSetting) -> int | None:
    """The training step (1-based) at whose forward DDP rebuilds its buckets, or ``None``.

    ``should_rebuild_buckets()`` is false with ``find_unused_parameters=True`` alone: never.
    Otherwise the reducer records the order of the gradients in one backward and rebuilds at the
    next forward: step 2; with ``static_graph=True`` the first backward only counts the
    gradient hooks (``static_graph_first_iteration``), so the order is recorded in step 2 and
    the rebuild comes at step 3. Checked against real runs (``tracing.ddp_run.rebuild_runs``).
    """
    if setting.find_unused_parameters and not setting.static_graph:
        return None
    return 3 if setting.static_graph else 2


def rebuilt_buckets(params: Sequence[Param], setting: DdpSetting,
                    order: Sequence[int]) -> list[Bucket]:
    """The buckets DDP uses from ``rebuild_step(setting)`` on, given the order in which the
    gradients became ready (``ready_order``); the first-iteration ones if it never rebuilds."""
    if rebuild_step(setting) is None:
        return initial_buckets(params, setting)
    return assign_buckets(params, setting.limits, order, last_small=setting.last_bucket_cap)


def step_buckets(params: Sequence[Param], setting: DdpSetting, order: Sequence[int],
                 step: int) -> list[Bucket]:
    """The buckets DDP's reducer uses in training step ``step`` (1-based): the first-iteration
    layout before ``rebuild_step(setting)`` (for ever if it is ``None``), the rebuilt one from
    that step on. ``order``: the gradient-ready order (``ready_order``)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step phải là số nguyên >= 1 (bước 1 là bước đầu), nhận được {step!r}.")
    at = rebuild_step(setting)
    if at is None or step < at:
        return initial_buckets(params, setting)
    return rebuilt_buckets(params, setting, order)
