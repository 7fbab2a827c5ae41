"""Measured bytes and state in real runs (gloo, CPU) against ``costs`` and ``memory``.

Model: ``MLP(16, 32, depth=3, 4)``; every dimension divides by the shard group sizes used
here (2), so FSDP adds no padding and the equalities are exact. Its head (132 parameters)
belongs to the root module, which is what makes the root-module detail visible.
"""

import pytest

from dpbook import costs, launch, measure, memory
from dpbook.train import Parallel

pytestmark = pytest.mark.distributed


def _run(par, world_size=2):
    reports = launch.spawn(measure.measure_step, par, world_size=world_size, backend="gloo",
                           timeout=180, output="none")
    r0 = reports[0]
    # Every rank sends the same volume and holds the same state (even sizes, no padding).
    assert all(r["volume"] == r0["volume"] and r["state"] == r0["state"] for r in reports)
    assert r0["root_params"] == 32 * 4 + 4
    return r0


def _check_state(r, world_size, strategy, **kw):
    predicted = memory.vram_ledger(r["num_params"], world_size, strategy, **kw)
    # measured where it was allocated (a census from before the model existed), by category:
    # parameters, gradients, optimizer state and DDP's bucket copy equal the ledger's
    assert r["state"].method == "census"
    assert r["state"].as_ledger() == predicted
    # Peak memory covers at least the state (plus activations and temporaries), by both
    # measures, and the census attributes every byte of its peak. The two peaks are not ordered:
    # the census also sees the batch, MemTracker may still hold an output that gloo's worker
    # thread lets go of late (it differed by 2 548 B one run in four under load).
    assert r["peak"].peak >= r["state"].total and r["peak"].allocated >= r["state"].total
    assert sum(r["peak"].parts.values()) == r["peak"].allocated


def test_ddp_all_reduces_every_gradient_once():
    r = _run(Parallel("ddp"))
    psi = 4 * r["num_params"]
    assert r["volume"] == costs.ddp_step_bytes(psi, 2)
    # DDP after warm-up: only AllReduce, and the buckets cover exactly the gradients
    assert {rec.collective for rec in r["records"]} == {"all_reduce"}
    assert sum(rec.nbytes for rec in r["records"]) == psi
    _check_state(r, 2, "DDP")
    # the bucket copy lives through the step: at the peak too, beside the gradients
    assert r["state"].buffers == psi and r["peak"].parts["buffers"] == psi
    assert r["peak"].parts["gradients"] == psi


def test_fsdp2_default_keeps_the_root_unsharded():
    r = _run(Parallel("fsdp2"))
    psi, root = 4 * r["num_params"], 4 * r["root_params"]
    # reshard_after_forward=None: blocks reshard, the root does not, so its parameters are
    # all-gathered once (forward) instead of twice.
    assert r["volume"] == costs.fsdp_step_bytes(psi, 2, "FULL_SHARD", root_bytes=root)
    assert r["volume"] != costs.fsdp_step_bytes(psi, 2, "FULL_SHARD")
    _check_state(r, 2, "FULL_SHARD")
    # between steps no communication buffer is left; at the peak, FSDP2's AllGather and
    # ReduceScatter buffers are there (a collective wrote them), at least the root unit's size
    assert r["state"].buffers == 0 and r["peak"].parts["buffers"] >= root


def test_fsdp2_reshard_true_is_three_halves_of_ddp():
    r = _run(Parallel("fsdp2", reshard_after_forward=True))
    psi = 4 * r["num_params"]
    # Explicit True reshards the root too: exactly the textbook 3 (N-1)/N Psi.
    assert r["volume"] == costs.fsdp_step_bytes(psi, 2, "FULL_SHARD")
    assert r["volume"].total == 1.5 * costs.ddp_step_bytes(psi, 2).total
    _check_state(r, 2, "FULL_SHARD")


def test_fsdp2_without_resharding_matches_shard_grad_op():
    r = _run(Parallel("fsdp2", reshard_after_forward=False))
    psi = 4 * r["num_params"]
    assert r["volume"] == costs.fsdp_step_bytes(psi, 2, "SHARD_GRAD_OP")
    assert r["volume"].all_gather_backward == 0
    _check_state(r, 2, "SHARD_GRAD_OP")


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_fsdp1_strategies(strategy):
    r = _run(Parallel("fsdp1", strategy=strategy))
    psi, root = 4 * r["num_params"], 4 * r["root_params"]
    # FSDP1 also skips resharding the root after forward (its flat parameter holds the head).
    expected = costs.fsdp_step_bytes(psi, 2, strategy, root_bytes=root)
    assert r["volume"] == expected
    if strategy == "NO_SHARD":
        assert {rec.collective for rec in r["records"]} == {"all_reduce"}
    # At rest (after optimizer.step) SHARD_GRAD_OP has resharded its parameters: 16 P / N.
    _check_state(r, 2, strategy)


@pytest.mark.slow
@pytest.mark.parametrize("par", [Parallel("fsdp1", strategy="HYBRID_SHARD", shard_size=2),
                                 Parallel("fsdp2", shard_size=2)], ids=["fsdp1", "fsdp2"])
def test_hybrid_shard_on_a_2x2_mesh(par):
    r = _run(par, world_size=4)
    psi, root = 4 * r["num_params"], 4 * r["root_params"]
    expected = costs.fsdp_step_bytes(psi, 4, "HYBRID_SHARD", shard_size=2, root_bytes=root)
    assert r["volume"] == expected
    # Inside a "node" (2 ranks) the shard collectives; across the 2 replicas, AllReduce of shards
    assert {rec.group_size for rec in r["records"]} == {2}
    _check_state(r, 4, "HYBRID_SHARD", shard_size=2)


def test_comm_log_records_sends_and_leaves_the_volume_alone():
    def ring_step(rank, world_size):
        import torch
        import torch.distributed as dist

        from dpbook.measure import CommLog

        with CommLog() as log:
            req = dist.isend(torch.ones(5), (rank + 1) % world_size)
            dist.recv(torch.empty(5), (rank - 1) % world_size)
            req.wait()
            req = dist.isend(torch.ones(3, dtype=torch.float64), (rank + 1) % world_size)
            dist.recv(torch.empty(3, dtype=torch.float64), (rank - 1) % world_size)
            req.wait()
            dist.all_reduce(torch.ones(2))
        return log.records, log.volume()

    for records, volume in launch.spawn(ring_step, world_size=2, backend="gloo", output="none"):
        # the two sends (recv_ is not recorded: its bytes are the peer's send), then AllReduce
        assert [(r.collective, r.nbytes, r.sent_bytes) for r in records] == [
            ("send", 20, 20.0), ("send", 24, 24.0), ("all_reduce", 8, 8.0)]
        assert volume.all_reduce == 8.0 and volume.total == 8.0


def test_sent_bytes_is_the_ring_formula_under_its_old_name():
    rec = measure.CommRecord("allreduce_", "all_reduce", 1000, 4, "backward")
    # a formula, by name: what NCCL's ring would send per rank, 2 (N-1)/N of the tensor
    assert rec.ring_share_bytes == rec.sent_bytes == 1500.0


def test_wire_names_are_still_importable_from_measure():
    from dpbook import wire

    for name in ("WireBytes", "WireCount", "gloo_wire_bytes", "gloo_step_wire", "store_barrier",
                 "GLOO_PREAMBLE", "tcp_snapshot", "wire_unavailable"):
        assert getattr(measure, name) is getattr(wire, name), name
