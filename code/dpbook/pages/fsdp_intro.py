"""Section 4.1.6 (FSDP): rank functions for the page, run by ``launch.spawn``.

``fsdp_tour`` does everything the page measures in one launch: the per-step volume of DDP and of
FSDP2 (``measure.measure_step``), what ``fully_shard`` turns a parameter into, and a
Distributed Checkpoint (DCP) save and load on every rank.
"""

from __future__ import annotations

import os

import torch

from ..train import Parallel

TOUR_PARALLELS = (Parallel("ddp"), Parallel("fsdp2", reshard_after_forward=True),
                  Parallel("fsdp2"))


def sharded_parameter(param) -> dict:
    """What one parameter looks like after ``fully_shard``: its type, the full (global) shape,
    the shape of this rank's local shard and the placement (``Shard(0)``: split by rows)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return {"is_dtensor": False, "full_shape": tuple(param.shape),
                "local_shape": tuple(param.shape), "placements": ()}
    return {"is_dtensor": True, "full_shape": tuple(param.shape),
            "local_shape": tuple(param.to_local().shape),
            "placements": tuple(str(p) for p in param.placements)}


def dcp_round_trip(rank: int, world_size: int, ckpt_dir: str, steps: int = 2) -> dict:
    """Rank function: train an FSDP2 MLP ``steps`` steps, save model and Adam state with DCP to
    ``ckpt_dir``, load them into a differently initialised FSDP2 model, and compare.

    Returns the shape of a sharded weight, the files written (rank 0's view), the full weights
    saved and loaded, Adam's step count before and after, and the loss of one more step taken by
    the original and by the restored model (equal if the whole training state came back).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from ..checks import int_at_least
    from ..data import rank_batch, synthetic_regression
    from ..models import build_mlp
    from ..train import apply_fsdp2, full_state_dict, train_step

    int_at_least("steps", steps)
    batch = 8
    ds = synthetic_regression(batch * world_size)

    def make(seed):
        model = apply_fsdp2(build_mlp(seed=seed))
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    model, opt = make(seed=0)
    shard = sharded_parameter(model.blocks[0].linear.weight)
    x, y = rank_batch(ds.tensors, rank, batch, next(model.parameters()).device)
    for _ in range(steps):
        train_step(model, opt, x, y)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt_dir)
    saved = full_state_dict(model)

    fresh, fresh_opt = make(seed=1)
    before = full_state_dict(fresh)
    msd2, osd2 = get_state_dict(fresh, fresh_opt)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    loaded = full_state_dict(fresh)

    def adam_step(o):
        return int(next(iter(o.state.values()))["step"].item())

    steps_saved, steps_loaded = adam_step(opt), adam_step(fresh_opt)
    next_loss = (train_step(model, opt, x, y), train_step(fresh, fresh_opt, x, y))
    dist.barrier()
    return {"rank": rank, "shard": shard, "files": sorted(os.listdir(ckpt_dir)),
            "saved": saved, "before": before, "loaded": loaded,
            "adam_steps": (steps_saved, steps_loaded), "next_loss": next_loss}


def fsdp_tour(rank: int, world_size: int, ckpt_dir: str, parallels=TOUR_PARALLELS) -> dict:
    """Rank function: ``measure_step`` for each of ``parallels`` (keyed by label), then
    ``dcp_round_trip`` into ``ckpt_dir``; one launch for the whole page."""
    from ..measure import measure_step

    out = {"measured": {p.label: measure_step(rank, world_size, p) for p in parallels}}
    out["dcp"] = dcp_round_trip(rank, world_size, ckpt_dir)
    return out
