"""DDP's gradient buckets: which gradients DDP packs together, and the order in which the
reducer launches their AllReduces. Pure functions; the animation is ``dpbook.widgets.ddp_buckets``,
a real run is recorded by ``dpbook.tracing.ddp_run``.

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
"""

from __future__ import annotations

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


def ddp_kwargs(bucket_cap_mb: float | None, first_bucket_cap_mb: float | None) -> dict:
    """DDP constructor arguments for the caps of ``cap_limits``."""
    if first_bucket_cap_mb is not None:
        cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        return {"bucket_cap_mb_list": [first_bucket_cap_mb, cap]}
    return {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
