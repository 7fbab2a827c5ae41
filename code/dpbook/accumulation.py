"""Gradient accumulation under DDP, with and without ``no_sync`` (section 4.1.4).

``accumulate_worker`` is a rank function for ``launch.spawn``. It wraps the bucket demo model
(``models.BucketNet``, in float64 so that sums in a different order agree to rounding) in DDP
with its default bucket caps, runs two synchronised warm-up steps (DDP rebuilds its buckets after
the first), then accumulates the gradient of the same ``K`` micro-batches in several ways:

* ``"no_sync"``: micro-batches 1..K-1 (forward *and* backward) inside ``ddp.no_sync()``, the last
  one outside: the way DDP's documentation prescribes;
* ``"sync_every"``: every micro-batch synchronised, as a loop that forgot ``no_sync`` would do;
* ``"no_sync_backward_only"``: the forward outside ``no_sync()``, only ``backward()`` inside, a
  common mistake: DDP decides in the forward pass whether the next backward synchronises.

It records the collectives of every micro-step with ``measure.CommLog`` and returns, per way, the
accumulated gradient, to be compared with the gradient of the whole global batch computed by one
plain model without DDP.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from .averaging import flat_grad, loss_fn
from .checks import int_at_least, one_of
from .data import rank_batch, synthetic_regression
from .launch import device
from .measure import CommLog
from .models import BUCKET_NET_D_IN, build_bucket_net
from .train import apply_ddp

MODES = ("no_sync", "sync_every", "no_sync_backward_only")
OUT_DIM = 256  # BucketNet's head


def global_batch(world_size: int, accumulation_steps: int, micro_batch: int,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 samples behind one optimizer step: ``world_size * K * micro_batch`` rows."""
    for name, value in (("world_size", world_size), ("accumulation_steps", accumulation_steps),
                        ("micro_batch", micro_batch)):
        int_at_least(name, value)
    ds = synthetic_regression(world_size * accumulation_steps * micro_batch, BUCKET_NET_D_IN,
                              OUT_DIM, seed=seed)
    return tuple(t.double() for t in ds.tensors)


def reference_gradient(world_size: int, accumulation_steps: int, micro_batch: int,
                       seed: int = 0) -> torch.Tensor:
    """One plain model (no DDP), one backward on the whole global batch: the target gradient."""
    model = build_bucket_net(seed).double()
    x, y = global_batch(world_size, accumulation_steps, micro_batch, seed)
    loss_fn(model(x), y).backward()
    return flat_grad(model)


def _accumulate(ddp, x, y, mode: str, rank: int, world_size: int, k_steps: int, b: int):
    """One optimizer step's worth of micro-batches; returns the collectives of each micro-step
    and the accumulated (and, where DDP synchronised, averaged) gradient."""
    records = []
    for k in range(k_steps):
        last = k == k_steps - 1
        # micro-batch k of every rank, then k + 1: disjoint, together the whole global batch
        xk, yk = rank_batch((x, y), rank, b, x.device, start=k * world_size * b)
        fwd_ctx = ddp.no_sync() if mode == "no_sync" and not last else contextlib.nullcontext()
        bwd_ctx = (ddp.no_sync() if mode == "no_sync_backward_only" and not last
                   else contextlib.nullcontext())
        with CommLog() as log:
            with fwd_ctx:
                loss = loss_fn(ddp(xk), yk) / k_steps  # mean over the K micro-batches
            with bwd_ctx:
                loss.backward()
        records.append(log.records)
    grad = flat_grad(ddp.module)
    ddp.zero_grad(set_to_none=True)
    return records, grad


def accumulate_worker(rank: int, world_size: int, modes=MODES, accumulation_steps: int = 4,
                      micro_batch: int = 8, seed: int = 0) -> dict:
    """Rank function: accumulate ``accumulation_steps`` micro-batches of ``micro_batch`` samples
    on a DDP model in each of ``modes``; see the module docstring. Returns the gradient bytes,
    and per mode the collectives of each micro-step and the accumulated gradient (on the CPU)."""
    for m in modes:
        one_of("modes", m, MODES)
    int_at_least("accumulation_steps", accumulation_steps)
    dev = device()
    ddp = apply_ddp(build_bucket_net(seed).double())  # DDP's default caps: 1 MiB, then 25 MiB
    x, y = (t.to(dev) for t in global_batch(world_size, accumulation_steps, micro_batch, seed))
    # Warm-up: two synchronised steps. DDP records the gradient-ready order in the first and
    # rebuilds its buckets at the start of the second forward (a few small Broadcasts).
    x0, y0 = rank_batch((x, y), rank, micro_batch, dev)
    for _ in range(2):
        loss_fn(ddp(x0), y0).backward()
        ddp.zero_grad(set_to_none=True)
    runs = {}
    for m in modes:
        records, grad = _accumulate(ddp, x, y, m, rank, world_size, accumulation_steps,
                                    micro_batch)
        runs[m] = {"records": records, "grad": grad}
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "accumulation_steps": accumulation_steps,
            "grad_bytes": sum(p.numel() * p.element_size() for p in ddp.module.parameters()),
            "runs": runs}
