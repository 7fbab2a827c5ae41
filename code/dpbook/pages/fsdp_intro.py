"""Section 4.1.6 (FSDP): rank functions for the page, run by ``launch.spawn``.

``fsdp_tour`` does everything the page measures in one launch: the collectives of one step of DDP
and of FSDP2, with the ring formula's bytes and the bytes counted on the rank's sockets
(``measure.measure_step``), what ``fully_shard`` turns a parameter into, which of a small
Transformer's embedding and head stay unsharded through the step (``root_unsharded``), and a
Distributed Checkpoint (DCP) save and load on every rank. ``traffic_tour`` measures only the
communication of the same three configurations (the page runs it on 4 ranks).
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
    saved and loaded, Adam's step count before and after, whether this rank's shards of Adam's
    two moments came back equal (``moments_equal``), and the losses of two more steps taken by
    the original and by the restored model (``next_loss``, ``later_loss``). The first of those
    losses is computed before ``optimizer.step()``, so it sees only the weights; the second
    follows one Adam step, so it also sees the moments. ``reset_loss`` is that second loss for
    a model given the saved weights but a fresh Adam (moments and step count at zero): it
    differs, which shows that ``later_loss`` can tell.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                         set_model_state_dict, set_state_dict)

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
    moments_equal = all(
        torch.equal(_local(opt.state[p][k]), _local(fresh_opt.state[q][k]))
        for p, q in zip(model.parameters(), fresh.parameters()) for k in ("exp_avg", "exp_avg_sq"))

    # the saved weights with a fresh Adam: what a checkpoint without the optimizer gives back
    bare, bare_opt = make(seed=1)
    bare_state = {"model": get_model_state_dict(bare)}
    dcp.load(bare_state, checkpoint_id=ckpt_dir)
    set_model_state_dict(bare, bare_state["model"])
    next_loss = (train_step(model, opt, x, y), train_step(fresh, fresh_opt, x, y))
    train_step(bare, bare_opt, x, y)
    later_loss = (train_step(model, opt, x, y), train_step(fresh, fresh_opt, x, y))
    reset_loss = train_step(bare, bare_opt, x, y)
    dist.barrier()
    return {"rank": rank, "shard": shard, "files": sorted(os.listdir(ckpt_dir)),
            "saved": saved, "before": before, "loaded": loaded,
            "adam_steps": (steps_saved, steps_loaded), "moments_equal": moments_equal,
            "next_loss": next_loss, "later_loss": later_loss, "reset_loss": reset_loss}


def _local(t):
    """This rank's part of a tensor: a DTensor's local shard, a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def traffic_tour(rank: int, world_size: int, parallels=TOUR_PARALLELS) -> dict:
    """Rank function: ``{label: measure.measure_traffic(...)}`` for each of ``parallels``: one
    step's collectives, the ring formula's bytes and the bytes on this rank's sockets."""
    from ..measure import measure_traffic

    return {p.label: measure_traffic(rank, world_size, p) for p in parallels}


def fsdp_tour(rank: int, world_size: int, ckpt_dir: str, parallels=TOUR_PARALLELS) -> dict:
    """Rank function: ``measure_step`` for each of ``parallels`` (keyed by label),
    ``root_unsharded``, then ``dcp_round_trip`` into ``ckpt_dir``; one launch for the page."""
    from ..measure import measure_step

    out = {"measured": {p.label: measure_step(rank, world_size, p) for p in parallels}}
    out["root"] = root_unsharded(rank, world_size)
    out["dcp"] = dcp_round_trip(rank, world_size, ckpt_dir)
    return out


# --- the root unit: what it keeps unsharded, and wrapping embedding and head apart

ROOT_WRAPPINGS = ("root", "root_true", "separate")
MOMENTS = ("lượt xuôi, khối cuối", "giữa lượt xuôi và lượt ngược", "lượt ngược, khối cuối",
           "lượt ngược, khối đầu")


def wrap_tiny_transformer(model, wrapping: str):
    """FSDP2 on ``models.TinyTransformer``. ``"root"``: ``fully_shard`` each block, then the
    root, which keeps the embedding, the final norm and the head (PyTorch's default
    ``reshard_after_forward=None``). ``"root_true"``: the same with
    ``reshard_after_forward=True`` for the root too. ``"separate"``: the embedding and
    ``[norm, head]`` are units of their own, resharded after forward, as torchtitan wraps
    ``tok_embeddings`` (``torchtitan/models/llama3/infra/parallelize.py``, ``apply_fsdp``); the
    root keeps nothing."""
    from ..checks import one_of
    from ..launch import device
    from ..train import shard_blocks

    one_of("wrapping", wrapping, ROOT_WRAPPINGS)
    model = model.to(device())
    separate = (model.embed, [model.norm, model.head]) if wrapping == "separate" else ()
    kwargs = {"reshard_after_forward": True} if wrapping == "root_true" else {}
    return shard_blocks(model, type(model.blocks[0]), separate=separate, **kwargs)


def _look_through_step(wrapping: str, rank: int, batch_size: int, x, y) -> dict:
    import torch
    from torch.distributed.tensor import DTensor

    from ..models.transformer import build_tiny_transformer

    model = wrap_tiny_transformer(build_tiny_transformer(), wrapping)
    seen = {}

    def look(moment):
        seen[moment] = {name: not isinstance(getattr(model, name).weight, DTensor)
                        for name in ("embed", "head")}

    hooks = (model.blocks[-1].register_forward_pre_hook(lambda *_: look(MOMENTS[0])),
             model.blocks[-1].register_full_backward_pre_hook(lambda *_: look(MOMENTS[2])),
             model.blocks[0].register_full_backward_pre_hook(lambda *_: look(MOMENTS[3])))
    dev = next(model.parameters()).device
    xb, yb = (t[rank * batch_size:(rank + 1) * batch_size].to(dev) for t in (x, y))
    logits = model(xb)
    look(MOMENTS[1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten()).backward()
    for h in hooks:
        h.remove()
    return seen


def root_unsharded(rank: int, world_size: int, batch_size: int = 4) -> dict:
    """Rank function: for each of ``ROOT_WRAPPINGS``, one step of a TinyTransformer, looking at
    four moments (``MOMENTS``: the last block's forward, between forward and backward, the last
    and the first block's backward) whether the embedding and the head are unsharded: FSDP2
    swaps a module's parameter between a sharded DTensor and a plain full tensor. Also returns
    the parameters of the embedding, the head and the whole model."""
    import warnings

    from ..models.transformer import build_tiny_transformer, random_tokens

    x, y = random_tokens(batch_size * world_size)
    out = {}
    with warnings.catch_warnings():
        # The head returns a view of its matmul; FSDP2 warns that an in-place op on it would
        # skip its pre-backward hook. The step below does none.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        for wrapping in ROOT_WRAPPINGS:
            out[wrapping] = _look_through_step(wrapping, rank, batch_size, x, y)
    ref = build_tiny_transformer()
    out["params"] = {"embed": ref.embed.weight.numel(),
                     "head": sum(p.numel() for p in ref.head.parameters()),
                     "total": sum(p.numel() for p in ref.parameters())}
    return out
