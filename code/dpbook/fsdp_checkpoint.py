"""Section 4.2.3 (FSDP in full), the checkpoint part: Distributed Checkpoint saved by N ranks
(``save_checkpoint``), loaded by M ranks, i.e. resharded (``resume_checkpoint``), or by one
process without a process group, for inference (``load_for_inference``).
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map

from .checks import int_at_least
from .launch import device

GLOBAL_BATCH = 16  # samples per step over all ranks: 8 each on 2 ranks, 4 each on 4


def _adam_fsdp2(seed: int):
    """The MLP in float64 under FSDP2, with Adam (whose two moments make resuming non-trivial)."""
    from .models import build_mlp
    from .train import apply_fsdp2

    model = apply_fsdp2(build_mlp(seed=seed).double())
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _step_on(model, optimizer, step: int, rank: int, world_size: int) -> float:
    """Train on this rank's slice of global batch number ``step`` (the same data for any N)."""
    from .data import rank_batch, synthetic_regression
    from .train import train_step

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
    def to_cpu(t):
        return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else t

    return {"model": tree_map(to_cpu, msd), "optim": tree_map(to_cpu, osd)}


def probe_inputs() -> torch.Tensor:
    """A fixed batch (float64) on which saved and restored models must predict the same."""
    from .data import synthetic_regression

    return synthetic_regression(4, seed=1).tensors[0].double()


def save_checkpoint(rank: int, world_size: int, ckpt_dir: str, steps: int = 2) -> dict:
    """Rank function: train ``steps`` steps, save model and Adam state with DCP (every rank writes
    its own shards), then take one more step. Returns the full state saved, the predictions on
    ``probe_inputs()``, the weights after the extra step, the local shape of a weight, the files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from .train import full_state_dict

    int_at_least("steps", steps)
    model, opt = _adam_fsdp2(seed=0)
    for step in range(steps):
        _step_on(model, opt, step, rank, world_size)
    msd, osd = get_state_dict(model, opt)  # sharded (DTensor) state dicts: no gathering
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt_dir)
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

    from .train import full_state_dict

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

    from .models import build_mlp

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
