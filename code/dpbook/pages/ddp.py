"""What DDP does around the training loop, seen in real runs (section 4.1.3).

* The orders ``DistributedSampler`` gives each rank are ``dpbook.data.sampler_epochs`` and
  ``sampler_orders`` (4.2.5 uses them too).
* ``ddp_lifecycle``: a rank function that builds a model with *its own* random weights
  (``seed=rank``), wraps it in DDP, trains a few steps and records every collective: the
  Broadcast at construction, the buffer Broadcast that opens each training step's forward (not
  every forward: ``buffer_broadcasts``), the AllReduce in backward.
  Rank 0 alone logs and saves ``ddp.module.state_dict()``.

They live in the package because ``spawn`` runs only functions that child processes can import.

The page's figures, drawn from what those runs returned:

* ``sampler_figure``: for each epoch, which rank receives each sample of the data set, and in
  which position of that rank's order; one panel without ``set_epoch``, one with.
* ``timeline_rows`` / ``collectives_figure``: the collectives one rank issued, in order, from
  DDP's construction through a few training steps, as bars of their size in bytes.

``preset_states``: the bytes one GPU holds under DDP for a few well-known models, the page's
argument that DDP stops at some model size whatever the number of GPUs.

``buffer_broadcasts``, ``bucket_storage``, ``uneven_join``: runs behind the errata of 4.1.3 and
4.1.1 (which forwards open with a Broadcast of buffers; the bucket copy of the gradients that a
rank holds unless ``gradient_as_bucket_view=True``; ``DDP.join`` with uneven inputs).

Colours are the book's colour-blind-safe palette (``dpbook.style``); labels are Vietnamese."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import vi
from ..checks import int_at_least
from ..data import rank_batch, synthetic_regression
from ..launch import device
from ..measure import CommLog
from ..memory import vram_ledger
from ..models import build_mlp
from ..shapes import Preset, presets
from ..style import PALETTE, rank_colour
from ..train import cpu_copy

IN_DIM, OUT_DIM = 16, 4  # build_mlp's defaults


def demo_model(seed: int) -> nn.Sequential:
    """A BatchNorm (parameters *and* buffers) in front of ``build_mlp(seed)``; one forward pass
    in training mode on ``seed``-dependent data makes the running statistics differ by seed."""
    model = nn.Sequential(OrderedDict(norm=nn.BatchNorm1d(IN_DIM), mlp=build_mlp(seed=seed)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.norm(torch.randn(32, IN_DIM, generator=g) + seed)
    return model


def bytes_by_dtype(tensors) -> dict[str, int]:
    """Total bytes of ``tensors`` grouped by dtype, e.g. ``{"torch.float32": 11408}``."""
    out: dict[str, int] = {}
    for t in tensors:
        out[str(t.dtype)] = out.get(str(t.dtype), 0) + t.numel() * t.element_size()
    return out


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return cpu_copy(module.state_dict())


def ddp_lifecycle(rank: int, world_size: int, steps: int = 3, batch_size: int = 8,
                  save_path: str | None = None) -> dict:
    """Rank function: DDP from construction to checkpoint, with every collective recorded.

    Returns this rank's weights before and right after wrapping, the collectives of the
    construction and of each step, the ``state_dict`` keys of the wrapper and of
    ``ddp.module``, the bytes of parameters and buffers by dtype, and the final weights.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    int_at_least("steps", steps)
    model = demo_model(seed=rank)  # every rank starts from different weights, on purpose
    before = _cpu_state(model)
    dev = device()
    with CommLog() as construction:
        ddp = DDP(model.to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    after = _cpu_state(ddp.module)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    ds = synthetic_regression(steps * batch_size * world_size, IN_DIM, OUT_DIM)
    step_records = []
    for step in range(steps):
        x, y = rank_batch(ds.tensors, rank, batch_size, dev, start=step * world_size * batch_size)
        with CommLog() as log:
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_records.append(log.records)
        if rank == 0:  # only rank 0 logs
            print(f"bước {step}: giá trị mất mát cục bộ của rank 0 = "
                  f"{vi.number(loss.item(), 4)}")
    if save_path is not None and rank == 0:  # only rank 0 saves, and the unwrapped model
        torch.save(_cpu_state(ddp.module), save_path)
    dist.barrier()  # no rank goes on (for instance, to load the file) before it is written
    return {
        "rank": dist.get_rank(), "world_size": dist.get_world_size(),
        "backend": dist.get_backend(), "device": str(dev),
        "before": before, "after": after, "final": _cpu_state(ddp.module),
        "construction": construction.records, "steps": step_records,
        "ddp_keys": list(ddp.state_dict()), "module_keys": list(ddp.module.state_dict()),
        "param_bytes": bytes_by_dtype(ddp.module.parameters()),
        "buffer_bytes": bytes_by_dtype(ddp.module.buffers()),
    }


COLLECTIVE_COLOURS = {"broadcast": PALETTE["blue"], "all_reduce": PALETTE["vermillion"],
                      "all_gather": PALETTE["green"]}


def owner_grid(per_rank: list[list[list[int]]], dataset_size: int) -> list[list[tuple]]:
    """``grid[epoch][i]``: the ``(rank, position)`` pairs that received sample ``i`` in that
    epoch (one pair when the ranks partition the data set)."""
    epochs = len(per_rank[0])
    grid = [[() for _ in range(dataset_size)] for _ in range(epochs)]
    for rank, orders in enumerate(per_rank):
        for epoch, order in enumerate(orders):
            for pos, i in enumerate(order):
                grid[epoch][i] = grid[epoch][i] + ((rank, pos),)
    return grid


def sampler_figure(without: list[list[list[int]]], with_: list[list[list[int]]],
                   dataset_size: int):
    """Two panels of ``epochs`` rows by ``dataset_size`` cells: colour = rank, number = position
    in that rank's order. ``without[r][e]``: rank ``r``'s order in epoch ``e``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    epochs = len(without[0])
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.1 * 2 * epochs + 1.6))
    titles = ("Không gọi set_epoch(): mọi epoch giống hệt nhau",
              "Có gọi set_epoch(epoch): mỗi epoch một cách chia và thứ tự mới")
    for ax, orders, title in zip(axes, (without, with_), titles):
        grid = owner_grid(orders, dataset_size)
        for e, row in enumerate(grid):
            for i, cell in enumerate(row):
                (rank, pos), = cell  # exactly one rank per sample: the figure relies on it
                ax.add_patch(Rectangle((i, e), 0.94, 0.9, color=rank_colour(rank)))
                ax.text(i + 0.47, e + 0.45, str(pos), ha="center", va="center", fontsize=10)
        ax.set_xlim(0, dataset_size)
        ax.set_ylim(epochs, 0)
        ax.set_xticks([i + 0.47 for i in range(dataset_size)], range(dataset_size))
        ax.set_yticks([e + 0.45 for e in range(epochs)], [f"epoch {e}" for e in range(epochs)])
        ax.set_title(title, fontsize=12, loc="left")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    axes[1].set_xlabel("chỉ số mẫu trong tập dữ liệu (số trong ô: thứ tự rank duyệt tới mẫu)")
    fig.legend(handles=[Patch(color=rank_colour(r), label=f"rank {r}")
                        for r in range(len(without))],
               loc="upper right", ncol=len(without), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


@dataclass(frozen=True)
class Row:
    """One collective in a rank's timeline."""

    phase: str  # "khởi tạo DDP", "bước 0", ...
    collective: str
    nbytes: int


def timeline_rows(construction, steps) -> list[Row]:
    """Flatten ``ddp_lifecycle``'s records (construction, then each step) into rows."""
    rows = [Row("khởi tạo DDP", r.collective, r.nbytes) for r in construction]
    for k, records in enumerate(steps):
        rows += [Row(f"bước {k}", r.collective, r.nbytes) for r in records]
    return rows


def collectives_figure(rows: list[Row]):
    """Bars of bytes (log scale) per collective, in issue order, one shaded band per phase."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(10, 4.2))
    x, spans = 0.0, []  # spans: [phase, first x, last x]
    for row in rows:
        if not spans or spans[-1][0] != row.phase:
            x += 0.8 if spans else 0.0
            spans.append([row.phase, x, x])
        spans[-1][2] = x + 0.8
        ax.bar(x, row.nbytes, width=0.8, align="edge",
               color=COLLECTIVE_COLOURS.get(row.collective, PALETTE["grey"]))
        ax.text(x + 0.4, row.nbytes * 1.15, vi.grouped(row.nbytes),
                ha="center", va="bottom", fontsize=8, rotation=90)
        x += 1.0
    for _, a, b in spans:
        ax.axvspan(a - 0.15, b + 0.15, color=PALETTE["light"], zorder=0)
    ax.set_xticks([(a + b) / 2 for _, a, b in spans], [p for p, _, _ in spans], fontsize=10)
    ax.tick_params(axis="x", length=0)
    ax.set_xlim(-0.4, x + 0.2)
    ax.set_yscale("log")
    ax.set_ylim(1, max(r.nbytes for r in rows) * 30)
    ax.set_ylabel("số byte của tensor (thang log)")
    ax.set_title("Các phép toán tập thể mà một rank phát ra, theo thứ tự thời gian",
                 fontsize=12, loc="left")
    names = {"broadcast": "Broadcast", "all_reduce": "AllReduce", "all_gather": "AllGather"}
    kinds = [k for k in names if any(r.collective == k for r in rows)]
    ax.legend(handles=[Patch(color=COLLECTIVE_COLOURS[k], label=names[k]) for k in kinds],
              loc="upper left", frameon=False, ncol=len(kinds))
    fig.tight_layout()
    return fig


STATE_PRESETS = ("gpt2-124m", "llama-7b", "llama-13b")


def preset_states(keys=STATE_PRESETS, world_size: int = 8) -> dict[str, tuple[Preset, float]]:
    """Each preset and the bytes one GPU holds under DDP with Adam in fp32 (also what
    ``torch.autocast`` keeps: fp32 parameters and gradients): parameters, gradients, Adam's
    moments and DDP's bucket copy of the gradients (``gradient_as_bucket_view=False``, the
    default), 20 bytes per parameter; the same for every ``world_size``."""
    known = presets()
    return {k: (known[k], vram_ledger(known[k].num_params, world_size, "DDP").total)
            for k in keys}


# ------------------------------------------------------------------ errata runs (4.1.1, 4.1.3)

def _wrap(model: nn.Module, **kwargs):
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = device()
    return DDP(model.to(dev), device_ids=[dev.index] if dev.type == "cuda" else None, **kwargs), dev


def buffer_broadcasts(rank: int, world_size: int) -> dict[str, int]:
    """Rank function: how many Broadcasts of buffers open each forward of a DDP model with a
    BatchNorm, after two warm-up steps (DDP rebuilds its buckets in step 2 with broadcasts of
    its own). The forwards, in order: a training step; an evaluation forward under
    ``torch.no_grad()``; the training step right after it; a micro-batch inside ``no_sync()``;
    the synchronising micro-batch right after it. DDP broadcasts buffers only when the
    previous forward ran with grad enabled and outside ``no_sync()``
    (``will_sync_module_buffers`` reads ``require_forward_param_sync``, which ``_post_forward``
    sets from the two)."""
    import contextlib

    ddp, dev = _wrap(demo_model(seed=0))
    ds = synthetic_regression(8 * world_size, IN_DIM, OUT_DIM)
    x, y = rank_batch(ds.tensors, rank, 8, dev)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def forward(grad: bool = True, sync: bool = True) -> int:
        ctx = contextlib.nullcontext() if sync else ddp.no_sync()
        with ctx:
            with torch.set_grad_enabled(grad), CommLog() as log:
                out = ddp(x)
            if grad:
                nn.functional.mse_loss(out, y).backward()
        return sum(r.collective == "broadcast" for r in log.records)

    for _ in range(2):  # warm-up: the bucket rebuild of step 2 broadcasts too
        forward()
        optimizer.step()
        optimizer.zero_grad()
    counts = {"train": forward(), "eval_no_grad": forward(grad=False),
              "train_after_eval": forward(), "no_sync": forward(sync=False),
              "sync_after_no_sync": forward()}
    return counts


def bucket_storage(rank: int, world_size: int, steps: int = 3) -> dict[bool, dict]:
    """Rank function: the storage one rank holds after ``optimizer.step()`` (Adam) under DDP,
    with ``gradient_as_bucket_view`` False (the default) and True. Bytes are counted by
    distinct storages (``untyped_storage()``): parameters, ``.grad``, Adam's two moments (its
    scalar ``step`` counters aside) and the flat bucket buffers that a communication hook sees
    (``GradBucket.buffer()``, the reducer's ``bucket.gradients``). ``grads_in_buckets``: every
    ``.grad`` is a view into a bucket's storage."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    int_at_least("steps", steps)
    out = {}
    for view in (False, True):
        model = build_mlp(seed=0)
        ddp, dev = _wrap(model, gradient_as_bucket_view=view)
        buckets: dict[int, torch.Tensor] = {}

        def hook(state, bucket):
            buckets[bucket.index()] = bucket.buffer()
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, hook)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        ds = synthetic_regression(8 * world_size, IN_DIM, OUT_DIM)
        x, y = rank_batch(ds.tensors, rank, 8, dev)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=False)
            nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()

        def storages(tensors) -> dict[int, int]:
            return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}

        params = storages(model.parameters())
        grads = storages(p.grad for p in model.parameters())
        moments = storages(t for s in optimizer.state.values() for t in s.values()
                           if torch.is_tensor(t) and t.numel() > 1)
        flat = storages(buckets.values())
        held = {**params, **grads, **moments, **flat}
        out[view] = {"num_params": sum(p.numel() for p in model.parameters()),
                     "params": sum(params.values()), "grads": sum(grads.values()),
                     "optimizer": sum(moments.values()), "buckets": sum(flat.values()),
                     "held": sum(held.values()), "grads_in_buckets": set(grads) <= set(flat)}
        del ddp
    return out


def uneven_join(rank: int, world_size: int, divide_by_initial_world_size: bool = True) -> dict:
    """Rank function: rank ``r`` has ``r + 1`` batches, so the ranks run out of data at
    different steps; ``with ddp.join(...)`` lets the ones that ran out shadow the others'
    AllReduces (with zeros) instead of leaving them waiting. Returns, for each of this rank's
    steps, the gradient DDP left and this rank's own local gradient."""
    model = nn.Linear(3, 1, bias=False).double()
    nn.init.constant_(model.weight, 0.5)
    ddp, dev = _wrap(model)
    g = torch.Generator().manual_seed(100 + rank)
    steps = []
    with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size):
        for _ in range(rank + 1):
            x = torch.randn(4, 3, generator=g, dtype=torch.float64).to(dev)
            y = torch.randn(4, 1, generator=g, dtype=torch.float64).to(dev)
            local = torch.autograd.grad(nn.functional.mse_loss(model(x), y), model.weight)[0]
            model.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            steps.append((model.weight.grad.detach().cpu().clone(), local.detach().cpu().clone()))
    return {"rank": rank, "steps": steps}
