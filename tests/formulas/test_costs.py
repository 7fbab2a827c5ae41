"""Closed-form communication volumes."""

import pytest

from dpbook import costs

PSI = 4 * 1_000_000_000  # bytes of fp32 gradients of a 1B-parameter model


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 1024])
def test_ddp_is_two_times_n_minus_one_over_n(n):
    assert costs.ddp_step_bytes(PSI, n).total == pytest.approx(2 * (n - 1) / n * PSI)


def test_ring_volume_tends_to_twice_the_buffer():
    vols = [costs.ring_bytes("all_reduce", PSI, n) / PSI for n in (2, 8, 64, 4096)]
    assert vols == sorted(vols) and vols[0] == 1.0 and 1.99 < vols[-1] < 2.0


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_fsdp_full_shard_is_one_and_a_half_ddp(n):
    fsdp = costs.fsdp_step_bytes(PSI, n, "FULL_SHARD")
    assert fsdp.total == pytest.approx(3 * (n - 1) / n * PSI)
    assert fsdp.total / costs.ddp_step_bytes(PSI, n).total == pytest.approx(1.5)
    grad_op = costs.fsdp_step_bytes(PSI, n, "SHARD_GRAD_OP")
    assert grad_op.all_gather_backward == 0 and grad_op.total == pytest.approx(costs.ddp_step_bytes(PSI, n).total)
    assert costs.fsdp_step_bytes(PSI, n, "NO_SHARD") == costs.ddp_step_bytes(PSI, n)


def test_root_parameters_skip_the_backward_all_gather():
    v = costs.fsdp_step_bytes(1000, 2, "FULL_SHARD", root_bytes=100)
    assert v.all_gather_forward == 500 and v.all_gather_backward == 450 and v.reduce_scatter == 500


def test_hybrid_shard_splits_intra_and_inter_node():
    # 2 nodes x 8 GPUs: full shard inside a node, all-reduce of the 1/8 shard across nodes
    v = costs.fsdp_step_bytes(PSI, 16, "HYBRID_SHARD", shard_size=8)
    assert v.all_gather_forward == pytest.approx(7 / 8 * PSI)
    assert v.all_reduce == pytest.approx(2 * (1 / 2) * PSI / 8)
    assert costs.fsdp_step_bytes(PSI, 8, "HYBRID_SHARD", shard_size=8) == costs.fsdp_step_bytes(PSI, 8)


def test_busbw_factors_match_nccl_tests():
    assert costs.busbw_factor("all_reduce", 8) == 2 * 7 / 8
    assert costs.busbw_factor("all_gather", 8) == costs.busbw_factor("reduce_scatter", 8) == 7 / 8
    assert costs.busbw_factor("broadcast", 8) == 1.0
    algbw, busbw = costs.bus_bandwidth("all_reduce", 1e9, 0.5, 4)
    assert algbw == 2e9 and busbw == 2e9 * 1.5


def test_alpha_beta_has_latency_and_bandwidth_terms():
    t = costs.alpha_beta_time("all_reduce", 1e6, 4, alpha=1e-5, bandwidth=1e9)
    assert t == pytest.approx(6 * 1e-5 + 1.5e6 / 1e9)
    # Small messages are latency-bound: halving the size barely changes the time.
    small = [costs.alpha_beta_time("all_reduce", s, 8, 1e-5, 1e10) for s in (1e3, 5e2)]
    assert small[1] / small[0] > 0.99


@pytest.mark.parametrize("call", [
    lambda: costs.ring_bytes("all_reduce", -1, 2),
    lambda: costs.ring_bytes("all_reduce", 10, 0),
    lambda: costs.ring_bytes("allreduce", 10, 2),
    lambda: costs.fsdp_step_bytes(10, 2, "ZERO9"),
    lambda: costs.fsdp_step_bytes(10, 4, "HYBRID_SHARD"),
    lambda: costs.fsdp_step_bytes(10, 4, "HYBRID_SHARD", shard_size=3),
    lambda: costs.fsdp_step_bytes(10, 2, root_bytes=11),
    lambda: costs.alpha_beta_time("all_reduce", 10, 2, alpha=-1, bandwidth=1),
])
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_chain_broadcast_and_reduce_carry_the_buffer_once_per_link(n):
    b = 1000.0
    bcast, red = costs.rooted_bytes("broadcast", b, n), costs.rooted_bytes("reduce", b, n)
    # Broadcast 0 -> 1 -> ... -> N-1: all but the last send b, all but the root receive b
    assert bcast.sent == tuple([b] * (n - 1) + [0.0]) if n > 1 else bcast.sent == (0.0,)
    assert bcast.received == (0.0,) + (b,) * (n - 1)
    # Reduce 1 -> 2 -> ... -> N-1 -> 0: all but the root send b, all but rank 1 receive b
    assert red.sent == (0.0,) + (b,) * (n - 1)
    assert red.received == ((b,) + (0.0,) + (b,) * (n - 2) if n > 1 else (0.0,))
    assert sum(bcast.sent) == sum(bcast.received) == sum(red.sent) == (n - 1) * b
    if n > 1:
        assert max(bcast.sent) == max(red.received) == costs.ring_bytes("broadcast", b, n) == b
    assert costs.rooted_links("reduce", n) == [(k, (k + 1) % n) for k in range(1, n)]
    assert bcast.traffic == tuple(s + r for s, r in zip(bcast.sent, bcast.received))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_star_route_is_the_naive_scheme_at_the_root(n):
    b = 1000.0
    bcast = costs.rooted_bytes("broadcast", b, n, "star")
    red = costs.rooted_bytes("reduce", b, n, "star")
    assert bcast.sent[0] == red.received[0] == costs.naive_all_reduce_bytes(b, n) == (n - 1) * b
    assert bcast.sent[1:] == red.received[1:] == (0.0,) * (n - 1)
    assert bcast.received[1:] == red.sent[1:] == (b,) * (n - 1)
    assert costs.rooted_links("broadcast", n, "star") == [(0, k) for k in range(1, n)]


@pytest.mark.parametrize("call, word", [
    (lambda: costs.rooted_bytes("all_reduce", 10, 2), "collective"),
    (lambda: costs.rooted_bytes("broadcast", 10, 2, "tree"), "route"),
    (lambda: costs.rooted_bytes("broadcast", -1, 2), "nbytes"),
    (lambda: costs.rooted_links("reduce", 0), "world_size"),
])
def test_rooted_bytes_rejects_bad_inputs(call, word):
    with pytest.raises(ValueError, match=word):
        call()


# --- step_time: alpha-beta time of one step on nodes x GPUs

LINKS = dict(alpha_intra=5e-6, bandwidth_intra=200e9, alpha_inter=20e-6, bandwidth_inter=25e9)


def test_step_time_on_one_node_is_alpha_beta_time_of_each_collective():
    t = costs.step_time(PSI, "DDP", 1, 8, compute_seconds=0.1, **LINKS)
    assert t.comm_seconds == costs.alpha_beta_time("all_reduce", PSI, 8, 5e-6, 200e9)
    t = costs.step_time(PSI, "FULL_SHARD", 1, 8, compute_seconds=0.1, **LINKS)
    ag = costs.alpha_beta_time("all_gather", PSI, 8, 5e-6, 200e9)
    rs = costs.alpha_beta_time("reduce_scatter", PSI, 8, 5e-6, 200e9)
    assert t.comm_seconds == pytest.approx(2 * ag + rs, rel=1e-12)
    assert t.serial_seconds == 0.1 + t.comm_seconds
    # SHARD_GRAD_OP issues no backward AllGather: neither its bytes nor its latency
    sgo = costs.step_time(PSI, "SHARD_GRAD_OP", 1, 8, compute_seconds=0.1, **LINKS)
    assert sgo.comm_seconds == pytest.approx(ag + rs, rel=1e-12)


def test_step_time_across_nodes_runs_at_the_slowest_link_and_matches_internode_bytes():
    t = costs.step_time(PSI, "DDP", 4, 8, compute_seconds=0.0, **LINKS)
    v = costs.ring_bytes("all_reduce", PSI, 32)
    assert t.comm_seconds == pytest.approx(2 * 31 * 20e-6 + v / 25e9, rel=1e-12)
    # HYBRID_SHARD: gathers inside the node; 8 rings of Psi/8 share the node's network
    h = costs.step_time(PSI, "HYBRID_SHARD", 4, 8, compute_seconds=0.0, **LINKS)
    vol = costs.fsdp_step_bytes(PSI, 32, "HYBRID_SHARD", shard_size=8)
    node = costs.internode_bytes(vol, "HYBRID_SHARD", 4, 8)
    inside = 3 * 7 * 5e-6 + (vol.all_gather_forward + vol.all_gather_backward
                             + vol.reduce_scatter) / 200e9
    assert h.comm_seconds == pytest.approx(inside + 2 * 3 * 20e-6 + node / 25e9, rel=1e-12)
    assert h.comm_seconds < costs.step_time(PSI, "FULL_SHARD", 4, 8, compute_seconds=0.0,
                                            **LINKS).comm_seconds


def test_step_time_overlap_is_the_bucket_bound_of_4_1_4():
    one = costs.step_time(PSI, "DDP", 1, 8, compute_seconds=0.5, **LINKS)
    assert one.overlap_seconds == one.serial_seconds  # one piece: nothing hides
    many = costs.step_time(PSI, "DDP", 1, 8, compute_seconds=0.5, messages=100, **LINKS)
    assert many.comm_seconds == pytest.approx(one.comm_seconds + 99 * 14 * 5e-6, rel=1e-12)
    assert many.overlap_seconds == max(0.5 + many.comm_seconds / 100, many.comm_seconds)
    assert many.overlap_seconds < one.overlap_seconds
    slow = costs.step_time(PSI, "DDP", 4, 8, compute_seconds=0.01, messages=10, **LINKS)
    assert slow.overlap_seconds == slow.comm_seconds  # communication-bound


@pytest.mark.parametrize("kwargs, message", [
    ({"nodes": 0}, "nodes phải là số nguyên >= 1, nhận được 0."),
    ({"strategy": "ZeRO-1"}, "strategy='ZeRO-1' không hợp lệ"),
    ({"compute_seconds": -1}, "compute_seconds phải là số không âm"),
    ({"messages": 0}, "messages phải là số nguyên >= 1"),
    ({"bandwidth_inter": 0}, "bandwidth_inter phải là số dương, nhận được 0."),
    ({"root_bytes": 2 * PSI}, "root_bytes phải nằm trong [0, param_bytes]"),
])
def test_step_time_refuses_bad_inputs(kwargs, message):
    args = dict(param_bytes=PSI, strategy="DDP", nodes=2, gpus_per_node=8, compute_seconds=0.1,
                **LINKS) | kwargs
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        costs.step_time(**args)
