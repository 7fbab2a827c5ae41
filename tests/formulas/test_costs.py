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
