"""Section 4.2.3 (FSDP in full): the rank functions of the practice page, run by ``launch.spawn``.

* ``wrap_units``: FSDP1 with a chosen ``sharding_strategy`` and ``auto_wrap_policy`` (by size or by
  block class) on a tiny Transformer, and FSDP2's ``fully_shard`` per block: which modules became
  units, how many parameters each unit manages, one training step.
* ``mixed_precision``: ``MixedPrecision`` (FSDP1) or ``MixedPrecisionPolicy`` (FSDP2): the dtypes
  seen inside forward, the dtype of the master weights and the bytes each collective carries.
* ``meta_init``: FSDP2 on a model built on the meta device, then materialised shard by shard.
* ``compare_with_ddp``: ``train.fit`` under DDP, FSDP1 and FSDP2 in one launch.
* the checkpoint runs: Distributed Checkpoint saved by N ranks (``save_checkpoint``), loaded by
  M ranks, i.e. resharded (``resume_checkpoint``), or by one process without a process group,
  for inference (``load_for_inference``); ``practice_tour`` runs ``save_checkpoint`` too.
* ``practice_tour``: all of the 2-rank runs above in one launch (starting processes is what
  costs time on a small CPU machine)."""

from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.distributed as dist
from torch import nn

from .. import vi
from ..checks import int_at_least, one_of
from ..launch import device
from ..train import amp_dtype, cpu_copy, dtype_name, grad_scaler, shard_blocks

POLICIES = ("size", "block", "transformer")


def wrap_policy(name: str, min_num_params: int = 4000):
    """An FSDP1 ``auto_wrap_policy``: ``"size"`` wraps every module that has at least
    ``min_num_params`` parameters not already in a wrapped child; ``"block"`` wraps each
    ``TransformerBlock`` (``ModuleWrapPolicy``); ``"transformer"`` is the older spelling of the
    same rule (``transformer_auto_wrap_policy``)."""
    from torch.distributed.fsdp.wrap import (ModuleWrapPolicy, size_based_auto_wrap_policy,
                                             transformer_auto_wrap_policy)

    from ..models.transformer import TransformerBlock

    one_of("policy", name, POLICIES)
    int_at_least("min_num_params", min_num_params)
    if name == "size":
        return functools.partial(size_based_auto_wrap_policy, min_num_params=min_num_params)
    if name == "block":
        return ModuleWrapPolicy({TransformerBlock})
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={TransformerBlock})


def fsdp_units(model: nn.Module) -> list[str]:
    """Names (as in the unwrapped model, root = ``""``) of the modules that are FSDP units:
    FSDP1 ``FullyShardedDataParallel`` wrappers or FSDP2 ``fully_shard`` modules."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    prefix = "_fsdp_wrapped_module."
    return [name.replace(prefix, "").removeprefix("_fsdp_wrapped_module")
            for name, m in model.named_modules()
            if isinstance(m, (FullyShardedDataParallel, FSDPModule))]


def unit_params(model: nn.Module, units: list[str]) -> dict[str, int]:
    """Parameters each unit manages in the *unwrapped* ``model``: those under its name that no
    deeper unit claims (the root ``""`` gets what is left over)."""
    owned = {u: 0 for u in units}
    for name, p in model.named_parameters():
        owners = [u for u in units if u == "" or name.startswith(u + ".")]
        if not owners:
            raise ValueError(f"Tham số {name} không thuộc đơn vị FSDP nào trong {units}.")
        owned[max(owners, key=len)] += p.numel()
    return owned


def _token_step(model: nn.Module, optimizer, rank: int, world_size: int, batch_size: int = 4,
                scaler=None):
    """One next-token step on this rank's slice of a fixed global batch; returns the loss.
    ``scaler`` (``train.grad_scaler``) scales the loss when the model computes in fp16."""
    from ..data import rank_batch
    from ..models.transformer import random_tokens

    dev = device()
    if scaler is None:
        scaler = grad_scaler(dev, None)  # disabled: scale, step and update pass through
    x, y = rank_batch(random_tokens(batch_size * world_size), rank, batch_size, dev)
    with warnings.catch_warnings():
        # FSDP2 warns that a linear layer on 3-D input returns a view; we never modify it in place.
        warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
        logits = model(x)
    # The loss in fp32 even when logits are 16-bit: softmax over a vocabulary needs the range.
    loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def wrap_units(rank: int, world_size: int, policies=POLICIES, strategy: str = "FULL_SHARD",
               min_num_params: int = 4000) -> dict:
    """Rank function: for each FSDP1 policy in ``policies`` (``sharding_strategy=strategy``) and
    for FSDP2 (``"fully_shard"``: one ``fully_shard`` per block), wrap a fresh tiny Transformer,
    list its units and their parameter counts, take one step (counting the AllGathers of its
    forward pass); also returns the wrapped tree."""
    from ..measure import CommLog, state_bytes
    from ..models.transformer import TransformerBlock, build_tiny_transformer
    from ..train import apply_fsdp, full_state_dict

    out = {}
    for name in (*policies, "fully_shard"):
        model = build_tiny_transformer()
        if name == "fully_shard":
            wrapped = shard_blocks(model.to(device()), TransformerBlock)
        else:
            wrapped = apply_fsdp(model, strategy, auto_wrap_policy=wrap_policy(name, min_num_params))
        units = fsdp_units(wrapped)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
        with CommLog() as log:
            loss = _token_step(wrapped, opt, rank, world_size)
        gathers = sum(r.collective == "all_gather" and r.phase == "forward" for r in log.records)
        out[name] = {"units": unit_params(build_tiny_transformer(), units), "loss": loss,
                     "forward_all_gathers": gathers,
                     "local_param_bytes": state_bytes(wrapped).params,
                     "state": full_state_dict(wrapped), "tree": str(wrapped)}
    return out


class DtypeProbe:
    """Forward hooks that note what a layer really computes with: the input and weight dtype of
    ``blocks[0].attn.qkv``, the dtype of the ``pos`` buffer and of the model's output."""

    def __init__(self, model: nn.Module):
        self.seen: dict[str, str] = {}
        qkv = model.blocks[0].attn.qkv
        qkv.register_forward_pre_hook(self._at_qkv)
        model.register_forward_pre_hook(lambda m, args: self._note("buffer pos", m.pos))
        model.register_forward_hook(lambda m, args, out: self._note("output", out))

    def _note(self, what: str, t: torch.Tensor) -> None:
        self.seen.setdefault(what, dtype_name(t.dtype))

    def _at_qkv(self, module, args) -> None:
        self._note("qkv input", args[0])
        self._note("qkv weight", module.weight)


def _dtypes(tensors) -> list[str]:
    return sorted({dtype_name(t.dtype) for t in tensors})


def precision_policy(method: str, dev: torch.device):
    """The mixed-precision policy of ``method`` on ``dev`` and its gradient scaler: compute in
    ``train.amp_dtype(dev)`` (bf16, or fp16 on a GPU without bf16 such as the T4, with loss
    scaling), reduce gradients in fp32. FSDP1's ``MixedPrecision`` casts buffers too; FSDP2's
    ``MixedPrecisionPolicy`` has no ``buffer_dtype``: buffers are not sharded, they keep their
    dtype."""
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    one_of("method", method, ("fsdp1", "fsdp2"))
    low, fp32 = amp_dtype(dev), torch.float32
    if method == "fsdp1":
        policy = MixedPrecision(param_dtype=low, reduce_dtype=fp32, buffer_dtype=low)
    else:
        policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=fp32)
    return policy, grad_scaler(dev, low, fsdp1=method == "fsdp1")


def mixed_precision(rank: int, world_size: int, method: str = "fsdp1") -> dict:
    """Rank function: one step of the tiny Transformer under FSDP1 ``MixedPrecision`` or FSDP2
    ``MixedPrecisionPolicy`` (``precision_policy``: 16-bit compute, fp32 gradient reduction).
    Returns the 16-bit dtype chosen and whether the loss was scaled, the dtypes seen in forward,
    the dtypes of stored parameters and gradients, and the bytes that AllGather and
    ReduceScatter carried per parameter."""
    from ..measure import CommLog
    from ..models import num_params
    from ..models.transformer import TransformerBlock, build_tiny_transformer
    from ..train import apply_fsdp, full_state_dict

    policy, scaler = precision_policy(method, device())
    model = build_tiny_transformer()
    probe = DtypeProbe(model)
    if method == "fsdp1":
        wrapped = apply_fsdp(model, auto_wrap_policy=wrap_policy("block"), mixed_precision=policy)
    else:
        wrapped = shard_blocks(model.to(device()), TransformerBlock, mp_policy=policy)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    with CommLog() as log:
        _token_step(wrapped, opt, rank, world_size, scaler=scaler)
    n = num_params(build_tiny_transformer())
    gathered = sum(r.nbytes for r in log.records if r.collective == "all_gather"
                   and r.phase == "forward")
    reduced = sum(r.nbytes for r in log.records if r.collective == "reduce_scatter")
    return {"dtype": dtype_name(policy.param_dtype), "scaler": scaler.is_enabled(),
            "seen": probe.seen, "num_params": n,
            "stored": _dtypes(wrapped.parameters()),
            "full_state": _dtypes(full_state_dict(wrapped).values()),
            "all_gather_bytes_per_param": gathered / n, "reduce_scatter_bytes_per_param": reduced / n}


def meta_init(rank: int, world_size: int) -> dict:
    """Rank function: build the MLP on the meta device (no memory), ``fully_shard`` it,
    ``to_empty`` so each rank allocates only its shards, then initialise two ways: re-running
    ``reset_parameters`` under the same seed, and broadcasting rank 0's full state dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from ..measure import state_bytes
    from ..models import MLP, Block, build_mlp, num_params
    from ..train import full_state_dict

    with torch.device("meta"):
        model = MLP()
    all_meta = all(p.is_meta for p in model.parameters())
    shard_blocks(model, Block)
    model.to_empty(device=device())  # allocates each rank's shards, uninitialised
    local = state_bytes(model).params
    ref = build_mlp(seed=0).state_dict()

    torch.manual_seed(0)  # the seed build_mlp uses: does re-running the init reproduce it?
    with warnings.catch_warnings():
        # On a CPU mesh DTensor warns that random ops are incomplete: that is what we show.
        warnings.filterwarnings("ignore", message=".*DTensor random operators.*")
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
    reset = full_state_dict(model)

    # In real life only rank 0 builds (or torch.load-s) the full model; the call fills the dict
    # it is given with DTensors, hence a fresh one rather than ``ref``.
    full = build_mlp(seed=0).state_dict() if rank == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                               broadcast_from_rank0=True))
    loaded = full_state_dict(model)
    return {"all_meta": all_meta, "num_params": num_params(model), "local_param_bytes": local,
            "reset_equal": {k: torch.equal(reset[k], v) for k, v in ref.items()},
            "loaded_equal": {k: torch.equal(loaded[k], v) for k, v in ref.items()}}


def compare_with_ddp(rank: int, world_size: int, steps: int = 4, batch_size: int = 8) -> dict:
    """Rank function: ``train.fit`` (float64, same data) under DDP, FSDP1 ``FULL_SHARD`` and
    FSDP2 in one launch; keyed by ``Parallel.label``."""
    from ..train import Parallel, fit

    pars = (Parallel("ddp"), Parallel("fsdp1", strategy="FULL_SHARD"), Parallel("fsdp2"))
    return {p.label: fit(rank, world_size, p, steps=steps, batch_size=batch_size) for p in pars}


# --- Distributed Checkpoint: save on N ranks, load on M ranks or in one plain process ---------

def practice_tour(rank: int, world_size: int, ckpt_dir: str) -> dict:
    """Rank function: every 2-rank run of the page in one launch, each printed as it ends."""
    import time

    stages = {"wrap": lambda: wrap_units(rank, world_size),
              "mp": lambda: {m: mixed_precision(rank, world_size, m) for m in ("fsdp1", "fsdp2")},
              "meta": lambda: meta_init(rank, world_size),
              "vs_ddp": lambda: compare_with_ddp(rank, world_size),
              "save": lambda: save_checkpoint(rank, world_size, ckpt_dir)}
    out = {}
    for name, run in stages.items():
        t0 = time.perf_counter()
        out[name] = run()
        if rank == 0:
            print(f"xong phần {name!r} sau {vi.number(time.perf_counter() - t0, 2)} s")
    return out


GLOBAL_BATCH = 16  # samples per step over all ranks: 8 each on 2 ranks, 4 each on 4


def _adam_fsdp2(seed: int):
    """The MLP in float64 under FSDP2, with Adam (whose two moments make resuming non-trivial)."""
    from ..models import build_mlp
    from ..train import apply_fsdp2

    model = apply_fsdp2(build_mlp(seed=seed).double())
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _step_on(model, optimizer, step: int, rank: int, world_size: int) -> float:
    """Train on this rank's slice of global batch number ``step`` (the same data for any N)."""
    from ..data import rank_batch, synthetic_regression
    from ..train import train_step

    if GLOBAL_BATCH % world_size:
        raise ValueError(f"world_size={world_size} phải chia hết GLOBAL_BATCH={GLOBAL_BATCH}.")
    tensors = (t.double() for t in synthetic_regression((step + 1) * GLOBAL_BATCH).tensors)
    x, y = rank_batch(tensors, rank, GLOBAL_BATCH // world_size, device(),
                      start=step * GLOBAL_BATCH)
    return train_step(model, optimizer, x, y)


def _full_training_state(model, optimizer) -> dict:
    """Full (unsharded) model and optimizer state dicts on the CPU, identical on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": cpu_copy(msd), "optim": cpu_copy(osd)}


def probe_inputs() -> torch.Tensor:
    """A fixed batch (float64) on which saved and restored models must predict the same."""
    from ..data import synthetic_regression

    return synthetic_regression(4, seed=1).tensors[0].double()


def cpu_safe_writer(ckpt_dir: str):
    """DCP's file writer for this rank. On a CPU rank (gloo) it copies nothing ahead: with the
    default ``per_thread_copy_ahead`` the writer builds ``_OverlappingCpuLoader`` whenever CUDA
    is visible, and that calls ``torch.cuda.current_stream()``, opening a CUDA context in a rank
    that must not touch the GPU (torch/distributed/checkpoint/filesystem.py,
    ``_write_files_from_queue``)."""
    import torch.distributed.checkpoint as dcp

    ahead = {"per_thread_copy_ahead": 0} if device().type == "cpu" else {}
    return dcp.FileSystemWriter(ckpt_dir, **ahead)


def save_checkpoint(rank: int, world_size: int, ckpt_dir: str, steps: int = 2) -> dict:
    """Rank function: train ``steps`` steps, save model and Adam state with DCP (every rank writes
    its own shards), then take one more step. Returns the full state saved, the predictions on
    ``probe_inputs()``, the weights after the extra step, the local shape of a weight, the files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ..train import full_state_dict

    int_at_least("steps", steps)
    model, opt = _adam_fsdp2(seed=0)
    for step in range(steps):
        _step_on(model, opt, step, rank, world_size)
    msd, osd = get_state_dict(model, opt)  # sharded (DTensor) state dicts: no gathering
    dcp.save({"model": msd, "optim": osd}, storage_writer=cpu_safe_writer(ckpt_dir))
    saved = _full_training_state(model, opt)
    with torch.no_grad():
        preds = model(probe_inputs().to(device())).cpu()
    _step_on(model, opt, steps, rank, world_size)
    dist.barrier()  # every rank has written before rank 0 lists the directory
    return {"saved": saved, "preds": preds, "after_next_step": full_state_dict(model),
            "local_shape": tuple(model.blocks[0].linear.weight.to_local().shape),
            "files": sorted(os.listdir(ckpt_dir))}


def resume_checkpoint(rank: int, world_size: int, ckpt_dir: str, steps: int = 2) -> dict:
    """Rank function: a fresh FSDP2 model (other seed) on ``world_size`` ranks, possibly not the
    number that saved, loads the checkpoint (DCP reads the pieces each new shard needs) and takes
    the next step (global batch ``steps``). Returns the full state loaded, the weights after that
    step and the local shape of a weight."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from ..train import full_state_dict

    model, opt = _adam_fsdp2(seed=1)
    msd, osd = get_state_dict(model, opt)  # the layout of *this* run: what to fill in
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = _full_training_state(model, opt)
    _step_on(model, opt, steps, rank, world_size)
    return {"loaded": loaded, "after_next_step": full_state_dict(model),
            "local_shape": tuple(model.blocks[0].linear.weight.to_local().shape)}


def load_for_inference(ckpt_dir: str) -> nn.Module:
    """Load the model part of a DCP checkpoint into a plain float64 MLP in *this* process, with
    no process group (DCP then reads every piece itself); returns the model in eval mode."""
    import torch.distributed.checkpoint as dcp

    from ..models import build_mlp

    if dist.is_initialized():
        raise ValueError("load_for_inference chạy trong một process thường, không có process "
                         "group; trong một rank, hãy dùng resume_checkpoint.")
    model = build_mlp(seed=1).double()
    state = {"model": model.state_dict()}  # only the keys asked for are read: no optimizer
    with warnings.catch_warnings():
        # DCP warns that, without a process group, it assumes a single process: that is the point.
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single.*")
        dcp.load(state, checkpoint_id=ckpt_dir)
    model.load_state_dict(state["model"])
    return model.eval()


# ------------------------------------------------------------------ the page's plain script

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                      "train_fsdp.py")


def run_script(nproc_per_node: int, batch_size: int, ckpt_dir: str, epochs: int = 3,
               backend: str = "auto", timeout: float = 150.0):
    """Run ``scripts/train_fsdp.py`` under ``torchrun --standalone`` (the CPU hidden when
    ``backend`` is ``"gloo"``: ``torchrun.BACKEND_ENV``) and return ``(command as a reader types
    it, completed process)``; the page merges and compares the checkpoints it leaves."""
    from .. import torchrun

    cmd = torchrun.command(SCRIPT, ["--epochs", epochs, "--batch-size", batch_size,
                                    "--checkpoint", ckpt_dir],
                           nproc_per_node=nproc_per_node, module=False)
    shown = torchrun.display(cmd).replace(os.path.dirname(SCRIPT) + os.sep, "")
    return shown, torchrun.run_process(cmd, timeout=timeout, env=torchrun.BACKEND_ENV[backend])
