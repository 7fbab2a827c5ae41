"""The calculators' pure part: the tables the page's JavaScript reads (``data``), and the Python
twin of each JavaScript function (``ledger``, ``step_bytes``, ``step_time``, ``recommend``).

A twin takes the same inputs as ``window.dpbookCalc.<name>(inputs)`` (a dict named as the
keyword arguments of the library function) and returns what the JavaScript returns: the
fields of the library's result, or ``{"error": message}`` with the library's ``ValueError``
message. Every number comes from the library (``memory.vram_ledger``, ``costs``,
``decision.recommend``); this module only reshapes it. The browser test compares the two.
"""

from __future__ import annotations

from dataclasses import asdict

from ... import costs, decision, memory
from ...checks import int_at_least, one_of
from ...shapes import presets

PANELS = ("ledger", "traffic", "decision")  # the calculators a page can show


def data() -> dict:
    """What the JavaScript needs besides its formulas, computed here by the library."""
    sharded = {s: _sharded(s) for s in memory.STRATEGIES}
    return {
        "presets": {k: {"label": p.label, "num_params": p.num_params,
                        "largest_unit": p.largest_unit, "root_unit": p.root_unit}
                    for k, p in presets().items()},
        "cards": [{"name": c.name, "usable_bytes": c.usable_bytes} for c in memory.CARDS],
        "memory": {"strategies": list(memory.STRATEGIES), "precisions": list(memory.PRECISIONS),
                   "optimizers": list(memory.OPTIMIZERS), "phases": list(memory.PHASES),
                   "bytes_per_param": {p: {o: list(memory.bytes_per_param(p, o))
                                           for o in memory.OPTIMIZERS}
                                       for p in memory.PRECISIONS},
                   "zero_redundancy_bytes": {o: list(memory.zero_redundancy_bytes(o))
                                             for o in memory.OPTIMIZERS},
                   "sharded": sharded, "offload_strategies": list(memory.OFFLOAD_STRATEGIES),
                   "kept_fraction": memory.CHECKPOINT_KEPT_FRACTION},
        "costs": {"strategies": list(costs.STRATEGIES)},
        "decision": {"candidates": list(decision.CANDIDATES), "in_node": list(decision.IN_NODE),
                     "across_nodes": list(decision.ACROSS_NODES),
                     "tiers": [list(t) for t in decision.TIERS],
                     "offloadable": list(decision.OFFLOADABLE),
                     "offload_copy_bytes": decision.OFFLOAD_COPY_BYTES,
                     "zero_broadcast_bytes": decision.ZERO_BROADCAST_BYTES,
                     "bucket_copy_bytes": decision.DDP_BUCKET_COPY_BYTES,
                     "labels": dict(decision.LABELS), "nothing_fits": decision.NOTHING_FITS},
    }


def _sharded(strategy: str) -> list[bool]:
    """Which of (parameters, gradients, optimizer state) ``strategy`` divides, read off the
    ledger itself at rest on 2 ranks (a shard group of 2 for HYBRID_SHARD)."""
    one = memory.vram_ledger(1, 1, strategy, shard_size=1)
    two = memory.vram_ledger(1, 2, strategy, shard_size=2)
    return [getattr(two, k) < getattr(one, k) for k in ("params", "grads", "optimizer")]


def _with_preset(inputs: dict) -> dict:
    kw = dict(inputs)
    preset = kw.pop("preset", None)
    if preset is not None:
        one_of("preset", preset, presets())
        p = presets()[preset]
        kw.update(num_params=p.num_params, largest_unit_params=p.largest_unit,
                  root_unit_params=p.root_unit)
    return kw


def ledger(inputs: dict) -> dict:
    """``memory.vram_ledger(**inputs)`` (or a ``preset`` of ``shapes.presets()``): its fields,
    ``state``, ``total``, and whether the total fits each card of ``memory.CARDS``."""
    try:
        led = memory.vram_ledger(**_with_preset(inputs))
    except ValueError as e:
        return {"error": str(e)}
    return {**asdict(led), "state": led.state, "total": led.total,
            "fits": [memory.fits(led.total, c) for c in memory.CARDS]}


def step_bytes(inputs: dict) -> dict:
    """``costs.fsdp_step_bytes`` on ``nodes * gpus_per_node`` ranks (HYBRID_SHARD: one node
    per shard group) and ``costs.internode_bytes``: bytes per GPU and per node in one step."""
    try:
        nodes, gpus, strategy = inputs["nodes"], inputs["gpus_per_node"], inputs["strategy"]
        int_at_least("nodes", nodes)
        int_at_least("gpus_per_node", gpus)
        vol = costs.fsdp_step_bytes(
            inputs["param_bytes"], nodes * gpus, strategy, root_bytes=inputs.get("root_bytes", 0.0),
            shard_size=gpus if strategy == "HYBRID_SHARD" else None)
        node = costs.internode_bytes(vol, strategy, nodes, gpus)
    except ValueError as e:
        return {"error": str(e)}
    return {**asdict(vol), "total": vol.total, "internode_bytes": node}


def step_time(inputs: dict) -> dict:
    """``costs.step_time(**inputs)``, its fields in seconds."""
    try:
        return asdict(costs.step_time(**inputs))
    except ValueError as e:
        return {"error": str(e)}


def recommend(inputs: dict) -> dict:
    """``decision.recommend`` on a ``decision.Job`` whose ``gpu`` is a card's name
    (``memory.card``): the choice (strategy, recomputation, offload, label), the reason, every
    candidate's price, every rung of the ladder priced (with its label), the usable bytes."""
    try:
        kw = _with_preset(inputs)
        kw["gpu"] = memory.card(kw["gpu"])
        rec = decision.recommend(decision.Job(**kw))
    except ValueError as e:
        return {"error": str(e)}
    return {"choice": rec.choice, "checkpointing": rec.checkpointing, "offload": rec.offload,
            "label": rec.label, "reason": rec.reason, "capacity_bytes": rec.job.capacity_bytes,
            "host_capacity_bytes": rec.job.host_capacity_bytes, "num_blocks": rec.job.num_blocks,
            "options": {k: asdict(o) for k, o in rec.options.items()},
            "ladder": [{**asdict(o), "label": o.label} for o in rec.ladder]}


TWINS = {"ledger": ledger, "stepBytes": step_bytes, "stepTime": step_time, "recommend": recommend}
