"""Lab E of section 4.2: write ZeRO-1 and FSDP (ZeRO-3) from scratch.

The learner's file defines ``ShardedOptimizer`` and ``fully_shard_scratch``; ``starter.py`` is
where they start, ``solution.py`` the reference solution, ``broken_*.py`` versions with one
deliberate mistake each (they reuse the solution and change one piece), and ``checker.py`` runs a
file on the ranks, against plain Adam, FSDP2's ``fully_shard``, the VRAM ledger and the
communication formula. The lab's model and units are defined here, once.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
STARTER = HERE / "starter.py"
SOLUTION = HERE / "solution.py"
BROKEN = {"unsharded_state": HERE / "broken_unsharded_state.py",
          "never_free": HERE / "broken_never_free.py",
          "all_reduce": HERE / "broken_all_reduce.py"}
# Three blocks and a head; the head's bias has 3 elements, so on 2 ranks it needs padding.
MODEL_KWARGS = {"in_dim": 16, "hidden": 32, "depth": 3, "out_dim": 3}


def build_model(**kwargs):
    """The lab's MLP (``models.build_mlp``, fp32), the same initial weights on every rank;
    ``kwargs`` replace entries of ``MODEL_KWARGS`` (a larger model on GPUs)."""
    from ...models import build_mlp

    return build_mlp(seed=0, **{**MODEL_KWARGS, **kwargs})


def units(model) -> list:
    """The units the lab shards: every block, then the head (a unit of its own, so the root
    module keeps no parameter)."""
    return list(model.blocks) + [model.head]
