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
    assert (r["state"].params, r["state"].grads, r["state"].optimizer) == \
        (predicted.params, predicted.grads, predicted.optimizer)
    # Peak memory covers at least the state (plus activations and temporaries).
    assert r["peak"].peak >= r["state"].total


def test_ddp_all_reduces_every_gradient_once():
    r = _run(Parallel("ddp"))
    psi = 4 * r["num_params"]
    assert r["volume"] == costs.ddp_step_bytes(psi, 2)
    # DDP after warm-up: only AllReduce, and the buckets cover exactly the gradients
    assert {rec.collective for rec in r["records"]} == {"all_reduce"}
    assert sum(rec.nbytes for rec in r["records"]) == psi
    _check_state(r, 2, "DDP")


def test_fsdp2_default_keeps_the_root_unsharded():
    r = _run(Parallel("fsdp2"))
    psi, root = 4 * r["num_params"], 4 * r["root_params"]
    # reshard_after_forward=None: blocks reshard, the root does not, so its parameters are
    # all-gathered once (forward) instead of twice.
    assert r["volume"] == costs.fsdp_step_bytes(psi, 2, "FULL_SHARD", root_bytes=root)
    assert r["volume"] != costs.fsdp_step_bytes(psi, 2, "FULL_SHARD")
    _check_state(r, 2, "FULL_SHARD")


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


def test_wire_bytes_counts_a_known_send_over_loopback_tcp():
    """The TCP_INFO offsets (120: bytes_acked, 128: bytes_received) against bytes we wrote."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    big, small = 3_000_001, 12_345

    def read(sock, n):
        got = 0
        while got < n:
            got += len(sock.recv(1 << 20))

    with measure.WireBytes() as wire:
        reader = threading.Thread(target=read, args=(b, big))
        reader.start()
        a.sendall(b"x" * big)  # more than the socket buffers: the reader must run meanwhile
        reader.join()
        b.sendall(b"y" * small)
        read(a, small)
    for s in (a, b, listener):
        s.close()
    # both ends live in this process: it sent and received both messages, nothing else
    assert wire.why is None
    assert wire.count == measure.WireCount(big + small, big + small, 2)


def _gloo_collectives(rank, world_size, numel):
    import torch
    import torch.distributed as dist

    from dpbook.measure import CommLog, WireBytes

    x = torch.ones(numel)
    shard = torch.empty(numel // world_size)
    full = torch.empty(numel)
    ops = {"all_reduce": lambda: dist.all_reduce(x),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, x),
           "all_gather": lambda: dist.all_gather_into_tensor(full, shard)}
    out = {}
    for name, op in ops.items():
        op()
        dist.barrier()
        with WireBytes() as wire, CommLog() as log:
            op()
        dist.barrier()
        out[name] = (wire.count, log.records)
    return out


def test_gloo_bytes_on_the_wire_follow_gloos_algorithms():
    """2 gloo ranks, a 4 MiB fp32 tensor. Expected payload, from gloo's source (not costs.py):

    * all_reduce: gloo/allreduce.cc ``ring``: 1 MiB segments, two per rank; a reduce-scatter
      pass and an allgather pass each forward the N - 1 = 1 chunk a rank does not own, so a rank
      sends 2 (N - 1) / N * S = S.
    * reduce_scatter_tensor: ProcessGroupGloo::reduce_scatter_tensor_coalesced all-reduces a
      clone of the whole input and keeps a slice: S again, twice the ring formula's S / 2.
    * all_gather_into_tensor: gloo/allgather.cc: a rank passes on the N - 1 = 1 other block
      of S / N: S / 2.

    Bytes are deterministic: only the message headers (48 B each, three per 1 MiB segment
    sent) come on top, hence the 0.1 % tolerance.
    """
    S = 4 * 2**20
    expected = {"all_reduce": S, "reduce_scatter": S, "all_gather": S // 2}
    ring = {"all_reduce": S, "reduce_scatter": S // 2, "all_gather": S // 2}
    reports = launch.spawn(_gloo_collectives, S // 4, world_size=2, backend="gloo",
                           timeout=180, output="none")
    for rank, report in enumerate(reports):
        for name, (wire, records) in report.items():
            assert wire is not None and wire.connections == 1  # one peer, one connection
            assert 0 <= wire.sent - expected[name] <= 0.001 * S, (name, wire)
            assert abs(wire.received - expected[name]) <= 0.001 * S, (name, wire)
            # the library's model of gloo, headers included, to the byte (sent: only this
            # rank's own writes; received may include a peer's barrier message)
            (rec,) = records
            assert wire.sent == measure.gloo_wire_bytes(rec, rank).sent
            assert rec.ring_share_bytes == ring[name]
    # the gap the book explains: on gloo a ReduceScatter costs what an AllReduce costs
    rs = reports[0]["reduce_scatter"][0].sent
    assert rs > 1.99 * ring["reduce_scatter"]


def test_wire_bytes_of_a_ddp_step_match_gloos_algorithm():
    (r0, r1) = launch.spawn(measure.measure_traffic, world_size=2, backend="gloo", timeout=180,
                            output="none")
    psi = 4 * r0["num_params"]
    for r in (r0, r1):
        # one bucket, one AllReduce of the gradients: the ring formula says Psi for N = 2
        assert r["volume"].total == psi
        # gloo's ring sends Psi too, plus 48 B headers: 2 segments per pass, 3 headers each
        assert r["wire"].sent == psi + 4 * 3 * 48
        assert r["wire"].sent == measure.gloo_step_wire(r["records"], r["rank"]).sent


def test_gloo_model_refuses_what_it_does_not_model():
    rec = measure.CommRecord("alltoall_base_", "all_to_all", 64, 2, "forward")
    with pytest.raises(ValueError, match="alltoall_base_"):
        measure.gloo_wire_bytes(rec)
