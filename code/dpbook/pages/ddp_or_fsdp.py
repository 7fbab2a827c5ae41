"""Choosing between DDP and FSDP, section 4.1.8: the page's tables, figure and real runs.

The decision rule itself (``Job``, ``Option``, ``Recommendation``, ``ladder``, ``price``,
``recommend``) lives in the formula layer, ``dpbook.decision``, so that the calculator of the HTML
book (``widgets.calculator``) runs the same copy; this module re-exports it for the page.
"""

from __future__ import annotations

import html
from dataclasses import replace

from .. import costs, memory, vi
from ..checks import int_at_least, one_of
from ..decision import (ACROSS_NODES, CANDIDATES, IN_NODE, LABELS, LADDER, NOTHING_FITS,
                        OFFLOADABLE, TIERS, Job, Option, Recommendation, bucket_copy_bytes,
                        gb_text, ladder, pcie_bytes, price, recommend, step_volume)
from ..style import GB

__all__ = ["ACROSS_NODES", "CANDIDATES", "IN_NODE", "LABELS", "LADDER", "NOTHING_FITS",
           "OFFLOADABLE", "TIERS", "Job", "Option", "Recommendation", "gb_text", "ladder",
           "pcie_bytes", "price", "recommend", "step_volume", "bucket_copy_bytes",
           "resnet50_num_params",
           "wrap_facts", "compare_run", "criteria_html", "decision_html", "ladder_html",
           "memory_figure", "PRECISION_SETTINGS", "precision_bytes", "compress_hook",
           "precision_run", "zero1_run", "optimizer_order"]


def resnet50_num_params(num_classes: int = 1000) -> int:
    """ResNet-50 (torchvision's layout) counted layer by layer: a 7x7 stem, bottleneck stages of
    3, 4, 6, 3 blocks (1x1, 3x3, 1x1 convolutions without bias, each followed by a BatchNorm
    with a weight and a bias per channel; a 1x1 projection in each stage's first block), and
    a fully connected head."""
    int_at_least("num_classes", num_classes)

    def conv_bn(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k + 2 * cout

    total, cin = conv_bn(3, 64, 7), 64
    for width, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3)):
        for b in range(blocks):
            total += conv_bn(cin, width, 1) + conv_bn(width, width, 3) + conv_bn(width, 4 * width, 1)
            total += conv_bn(cin, 4 * width, 1) if b == 0 else 0  # the projection shortcut
            cin = 4 * width
    return total + cin * num_classes + num_classes


# --- a real run: what changes between DDP and FSDP, in bytes and in the code around the model

def wrap_facts(par) -> dict:
    """What wrapping with ``par`` means for the surrounding code: does the wrapped model still
    expose the original parameter objects (an optimizer built before wrapping would be
    silently wrong otherwise), and what does ``state_dict()`` hold."""
    from ..models import build_mlp
    from ..train import apply_parallel

    model = build_mlp()
    before = list(model.parameters())
    wrapped = apply_parallel(model, par)
    after = list(wrapped.parameters())
    key, value = next(iter(wrapped.state_dict().items()))
    return {"same_parameters": len(before) == len(after) and all(
                a is b for a, b in zip(before, after)),
            "first_key": key, "value_type": type(value).__name__}


def compare_run(rank: int, world_size: int, parallels=None) -> dict:
    """Rank function for ``launch.spawn``: ``measure.measure_step`` and ``wrap_facts`` for DDP
    and FSDP2 (``reshard_after_forward=True``, i.e. FULL_SHARD), keyed by label; then, in the
    same launch, ``precision_run``, ``zero1_run`` and ``optimizer_order`` (keys ``"precision"``,
    ``"zero1"``, ``"optimizer_order"``)."""
    from ..measure import measure_step
    from ..train import Parallel

    parallels = parallels or (Parallel("ddp"), Parallel("fsdp2", reshard_after_forward=True))
    out = {p.label: {**measure_step(rank, world_size, p), "code": wrap_facts(p)}
           for p in parallels}
    out["precision"] = precision_run(rank, world_size)
    out["zero1"] = zero1_run(rank, world_size)
    out["optimizer_order"] = optimizer_order(rank, world_size)
    return out


# --- what the page shows: tables (HTML, so they render in the static book) and a figure

_FORMULAS = {  # memory: p, g, o bytes per parameter of parameters, gradients, optimizer state;
    # ZeRO-1 as PyTorch runs it: zpg fp32 parameters and gradients, zo the optimizer's own state
    "memory": {"DDP": "{k}P", "ZeRO-1": "{zpg}P + {zo}P/N", "SHARD_GRAD_OP": "{p}P + {go}P/N",
               "FULL_SHARD": "{k}P/N + gốc và một khối đầy đủ",
               "HYBRID_SHARD": "{k}P/S + gốc và một khối đầy đủ"},
    "sent": {"DDP": "2(N−1)/N · Ψ",
             "ZeRO-1": "2(N−1)/N · Ψ + (N−1)/N · 4P (AllReduce, rồi Broadcast tham số fp32)",
             "SHARD_GRAD_OP": "2(N−1)/N · Ψ", "FULL_SHARD": "3(N−1)/N · Ψ",
             "HYBRID_SHARD": "3(S−1)/S · Ψ + 2(R−1)/R · Ψ/S"},
    "code": {"DDP": "thấp: bọc DDP(model, gradient_as_bucket_view=True), DistributedSampler, "
                    "rank 0 lưu state_dict",
             "ZeRO-1": "thấp: giữ DDP (gradient_as_bucket_view=True), thay bộ tối ưu bằng "
                       "ZeroRedundancyOptimizer; gom trạng thái bằng consolidate_state_dict "
                       "trước khi lưu",
             "SHARD_GRAD_OP": "như FULL_SHARD, với reshard_after_forward=False",
             "FULL_SHARD": "cao hơn: fully_shard từng khối rồi gốc, tạo optimizer sau khi bọc, "
                           "MixedPrecisionPolicy, lưu bằng DCP trên mọi rank",
             "HYBRID_SHARD": "như FULL_SHARD, thêm DeviceMesh hai chiều (node × GPU)"},
    "scale": {"DDP": "mô hình vừa một GPU, một hay nhiều node",
              "ZeRO-1": "chỉ trạng thái bộ tối ưu làm tràn GPU",
              "SHARD_GRAD_OP": "tham số đầy đủ vẫn vừa, gradient và bộ tối ưu thì không",
              "FULL_SHARD": "không vừa một GPU; một node, hoặc chia trong một node vẫn không vừa",
              "HYBRID_SHARD": "nhiều node, mô hình vừa khi chia trong một node"},
}


def _table(header: list[str], rows: list[list[str]]) -> str:
    def cells(tag: str, row: list[str]) -> str:
        return "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in row)

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f'<table class="dpbook-table"><thead><tr>{cells("th", header)}</tr></thead>' \
           f"<tbody>{body}</tbody></table>"


def criteria_html(rec: Recommendation) -> str:
    """The comparison table of the four criteria, formulas and this job's numbers."""
    def gb(nbytes: float) -> str:
        return f"{gb_text(nbytes, 2)} GB"

    names = list(rec.options)
    p, g, o = memory.bytes_per_param(rec.job.precision, rec.job.optimizer)
    zp, zg, zo = memory.zero_redundancy_bytes(rec.job.optimizer)
    sizes = {"k": p + g + o, "p": p, "go": g + o, "zpg": zp + zg, "zo": zo}
    rows = [["Bộ nhớ mỗi GPU (trạng thái + activation)"]
            + [f"{_FORMULAS['memory'][c].format(**sizes)} + activation: "
               f"{gb(rec.options[c].memory_bytes)}" for c in names],
            ["Lượng gửi mỗi GPU mỗi bước"]
            + [f"{_FORMULAS['sent'][c]}: {gb(rec.options[c].sent_bytes)}" for c in names]]
    if rec.job.nodes > 1:
        rows.append(["Lượng ra khỏi mỗi node mỗi bước"]
                    + [gb(rec.options[c].internode_bytes) for c in names])
    rows += [["Độ phức tạp mã nguồn"] + [_FORMULAS["code"][c] for c in names],
             ["Quy mô phù hợp"] + [_FORMULAS["scale"][c] for c in names]]
    return _table(["Tiêu chí"] + [LABELS[c] for c in names], rows)


def decision_html(recs: list[Recommendation]) -> str:
    """One row per job: GPUs, memory per GPU under each candidate, the choice."""
    def mem(r, c):
        o = r.options.get(c)
        return "—" if o is None else gb_text(o.memory_bytes) + ("" if o.fits else " ✗")

    rows = [[r.job.name,
             f"{r.job.nodes} × {r.job.gpus_per_node} × {r.job.gpu.name}",
             gb_text(r.job.capacity_bytes)] + [mem(r, c) for c in CANDIDATES]
            + [r.label] for r in recs]
    return _table(["Trường hợp", "node × GPU", "dùng được (GB)"]
                  + [f"{c} (GB)" for c in CANDIDATES] + ["Lựa chọn"], rows)


def ladder_html(rec: Recommendation) -> str:
    """Every rung ``recommend`` priced for one job, lowest first: GPU bytes (✓ if the rung
    fits), host bytes per node and PCIe bytes per GPU with offload, bytes sent per GPU; the
    chosen rung is marked, the rungs above it are the ones it did not need."""
    def mark(o: Option) -> str:
        return "← chọn" if o is rec.chosen else ("✓" if o.fits else "✗")

    rows = [[o.label, gb_text(o.memory_bytes), gb_text(o.host_bytes) if o.offload else "—",
             gb_text(o.pcie_bytes) if o.offload else "—", gb_text(o.sent_bytes), mark(o)]
            for o in rec.ladder]
    return _table(["Bậc", "GPU (GB)", "CPU mỗi node (GB)", "PCIe mỗi GPU mỗi bước (GB)",
                   "gửi mỗi GPU mỗi bước (GB)", "vừa?"], rows)


def memory_figure(job: Job, world_sizes=(1, 2, 4, 8, 16, 32, 64)):
    """Bytes per GPU against the number of GPUs for DDP and FULL_SHARD, with what PyTorch can
    allocate on the card and what the job lets itself use (GB of 10⁹ B throughout)."""
    import matplotlib.pyplot as plt

    from ..style import PALETTE

    ys = {c: [price(replace(job, gpus_per_node=n, nodes=1), c).memory_bytes / GB
              for n in world_sizes] for c in ("DDP", "FULL_SHARD")}
    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    ax.plot(world_sizes, ys["DDP"], "o-", color=PALETTE["vermillion"], label="DDP")
    ax.plot(world_sizes, ys["FULL_SHARD"], "s-", color=PALETTE["blue"], label="FSDP FULL_SHARD")
    ax.axhline(job.gpu.usable_bytes / GB, color=PALETTE["black"], lw=1.5,
               label=f"{job.gpu.name}: PyTorch cấp phát được "
                     f"{vi.number(job.gpu.usable_bytes / GB, 1)} GB")
    ax.axhline(job.capacity_bytes / GB, color=PALETTE["grey"], ls="--",
               label=f"dùng được (để trống {vi.percent(job.headroom, 0)})")
    if job.activation_gb:
        ax.axhline(job.activation_gb, color=PALETTE["green"], ls=":",
                   label=f"activation: {vi.general(job.activation_gb)} GB (không chia mảnh)")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(world_sizes, [str(n) for n in world_sizes])
    ax.set_xlabel("số GPU N")
    ax.set_ylabel("bộ nhớ mỗi GPU (GB, 10⁹ byte)")
    ax.set_title(f"{job.name}: bộ nhớ mỗi GPU (trạng thái, đơn vị gom về, activation)", loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: the curves fill the axes
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig, ys


# --- what mixed precision really sends: DDP under autocast, DDP with a compression hook, FSDP2

# (name shown, wrapping, AllGather bytes per parameter, ReduceScatter or AllReduce bytes per
# parameter). DDP all-reduces ``.grad``, whose dtype is the parameter's (fp32 under autocast);
# only a communication hook, or bf16 parameters, changes it. FSDP2 all-gathers in
# ``param_dtype`` and reduce-scatters in ``reduce_dtype``. The hook is ``bf16_compress_hook``
# on a GPU; DDP refuses it without CUDA and NCCL (``DistributedDataParallel._check_comm_hook``),
# so a CPU rank uses ``fp16_compress_hook``: the same ``_compress_hook``, 2 bytes per element.
PRECISION_SETTINGS = (
    ("DDP, fp32", "ddp", None, 0, 4),
    ("DDP + autocast bf16", "ddp_autocast", None, 0, 4),
    ("DDP + autocast + hook nén 16 bit", "ddp_hook", None, 0, 2),
    ("FSDP2, fp32", "fsdp2", None, 4, 4),
    ("FSDP2, param bf16, reduce fp32", "fsdp2", "float32", 2, 4),
    ("FSDP2, param bf16, reduce bf16", "fsdp2", "bfloat16", 2, 2),
)


def precision_bytes(num_params: int, world_size: int, setting: str) -> "costs.StepVolume":
    """Bytes one rank sends in one step with ``setting`` (a name of ``PRECISION_SETTINGS``),
    under the ring model: DDP one AllReduce of the gradients, FSDP (resharding every unit,
    the root too) two AllGathers of the parameters and one ReduceScatter of the gradients."""
    int_at_least("num_params", num_params)
    rows = {name: (ag, red) for name, _, _, ag, red in PRECISION_SETTINGS}
    one_of("setting", setting, rows)
    ag, red = rows[setting]
    if not ag:
        return costs.ddp_step_bytes(red * num_params, world_size)
    return replace(costs.fsdp_step_bytes(ag * num_params, world_size, "FULL_SHARD"),
                   reduce_scatter=costs.ring_bytes("reduce_scatter", red * num_params, world_size))


def compress_hook(dev):
    """DDP's 16-bit compression hook for a rank on ``dev``: ``bf16_compress_hook`` on a GPU,
    ``fp16_compress_hook`` on a CPU (DDP accepts the bf16 one only with CUDA and NCCL)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook if dev.type == "cuda" \
        else default_hooks.fp16_compress_hook


def _wrap_for_precision(model, how: str, reduce_dtype: str | None):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from ..train import apply_ddp, apply_fsdp2

    if how.startswith("ddp"):
        wrapped = apply_ddp(model)
        if how == "ddp_hook":
            wrapped.register_comm_hook(None, compress_hook(next(wrapped.parameters()).device))
        return wrapped
    mp = {} if reduce_dtype is None else {"mp_policy": MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, reduce_dtype))}
    return apply_fsdp2(model, reshard_after_forward=True, **mp)


def precision_run(rank: int, world_size: int, batch_size: int = 8, warmup: int = 2) -> dict:
    """Rank function: for every ``PRECISION_SETTINGS`` row, train the small MLP and record the
    collectives of one step after ``warmup`` steps (``measure.CommLog``). Returns, by name, the
    step's ``StepVolume`` and the dtypes of the stored parameters and of their ``.grad`` after
    backward (FSDP2 casts the reduced gradient back to the parameter's dtype, fp32, whatever
    ``reduce_dtype``: ``foreach_reduce`` in ``torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py``)."""
    import contextlib

    import torch

    from ..data import rank_batch, synthetic_regression
    from ..measure import CommLog
    from ..models import build_mlp

    ds = synthetic_regression(batch_size * world_size)
    out = {}
    for name, how, reduce_dtype, _, _ in PRECISION_SETTINGS:
        model = _wrap_for_precision(build_mlp(), how, reduce_dtype)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        dev = next(model.parameters()).device
        x, y = rank_batch(ds.tensors, rank, batch_size, dev)
        cast = torch.autocast(dev.type, dtype=torch.bfloat16) if how != "ddp" or reduce_dtype \
            else contextlib.nullcontext()
        for i in range(warmup + 1):
            with CommLog() if i == warmup else contextlib.nullcontext() as log:
                with cast if how.startswith("ddp") else contextlib.nullcontext():
                    out_ = model(x)
                torch.nn.functional.mse_loss(out_.float(), y).backward()
            p0 = next(model.parameters())
            grad_dtype = str(p0.grad.dtype).removeprefix("torch.")
            opt.step()
            opt.zero_grad(set_to_none=True)
        out[name] = {"volume": log.volume(), "param_dtype": str(p0.dtype).removeprefix("torch."),
                     "grad_dtype": grad_dtype, "records": log.records}
    return out


# --- ZeRO-1 in PyTorch: DDP plus ZeroRedundancyOptimizer

def zero1_run(rank: int, world_size: int, batch_size: int = 8, warmup: int = 2) -> dict:
    """Rank function: DDP with ``ZeroRedundancyOptimizer`` (Adam), PyTorch's ZeRO-1. Records one
    step's collectives and the optimizer state this rank holds (its partition only)."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from ..data import rank_batch, synthetic_regression
    from ..measure import CommLog, state_bytes
    from ..models import build_mlp
    from ..train import apply_ddp, train_step

    model = apply_ddp(build_mlp())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    ds = synthetic_regression(batch_size * world_size)
    x, y = rank_batch(ds.tensors, rank, batch_size, next(model.parameters()).device)
    for _ in range(warmup):
        train_step(model, opt, x, y)
    with CommLog() as log:
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {"records": log.records, "state": state_bytes(model, opt.optim),
            "local_params": sum(p.numel() for g in opt.optim.param_groups for p in g["params"])}


# --- the optimizer must be built after fully_shard

def optimizer_order(rank: int, world_size: int, batch_size: int = 8) -> dict:
    """Rank function: two FSDP2 MLPs, one with Adam built *before* ``fully_shard``, one after;
    one step each. Returns, for ``"before"`` and ``"after"``: whether the model's (full)
    parameters changed, whether the optimizer's parameters are the model's, how many of them
    got a ``.grad``, the bytes the optimizer's ``param_groups`` hold on this rank (the full
    originals, or local shards) and the bytes of this rank's shards of the model's parameters.

    ``fully_shard`` replaces every parameter: ``FSDPParam._init_sharded_param``
    (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``) builds a new ``nn.Parameter``
    around a sharded DTensor and sets it on the module (``_setattr_on_modules``); the old one
    stays alive only through whoever still refers to it, here the optimizer."""
    import torch

    from ..data import rank_batch, synthetic_regression
    from ..measure import local_bytes
    from ..models import build_mlp
    from ..train import apply_fsdp2, full_state_dict

    ds = synthetic_regression(batch_size * world_size)
    out = {}
    for order in ("before", "after"):
        model = build_mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2) if order == "before" else None
        apply_fsdp2(model)
        opt = opt or torch.optim.Adam(model.parameters(), lr=1e-2)
        held = [p for g in opt.param_groups for p in g["params"]]
        x, y = rank_batch(ds.tensors, rank, batch_size, next(model.parameters()).device)
        start = full_state_dict(model)
        torch.nn.functional.mse_loss(model(x), y).backward()
        with_grad = sum(p.grad is not None for p in held)
        opt.step()
        end = full_state_dict(model)
        ids = {id(p) for p in model.parameters()}
        out[order] = {
            "changed": any(not torch.equal(start[k], end[k]) for k in start),
            "same_objects": all(id(p) in ids for p in held),
            "with_grad": with_grad, "held": len(held),
            "optimizer_bytes": sum(local_bytes(p) for p in held),
            "shard_bytes": sum(local_bytes(p) for p in model.parameters()),
            "adam_states": len(opt.state),
        }
    return out
