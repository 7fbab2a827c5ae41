"""The ring simulators against exact sums and the closed-form byte counts."""

import pytest
import torch

from dpbook import collectives, costs


def _inputs(n, numel, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Integer-valued floats: sums are exact in any order, so equality can be exact.
    return [torch.randint(-1000, 1000, (numel,), generator=g).float() for _ in range(n)]


@pytest.mark.parametrize("n", range(2, 17))
@pytest.mark.parametrize("numel", [1, 7, 64, 101])
def test_all_reduce_sums_and_bytes(n, numel):
    xs = _inputs(n, numel)
    res = collectives.all_reduce(xs)
    total = torch.stack(xs).sum(0)
    assert all(torch.equal(o, total) for o in res.outputs)
    padded_bytes = res.padded_numel * 4
    assert res.padded_numel == -(-numel // n) * n  # padded to the next multiple of n, no more
    for r in range(n):
        assert res.bytes_sent(r) == res.bytes_received(r) == 2 * (n - 1) / n * padded_bytes
        assert res.bytes_sent(r) == costs.ring_bytes("all_reduce", padded_bytes, n)
    assert res.steps == 2 * (n - 1)


@pytest.mark.parametrize("n", range(2, 17))
@pytest.mark.parametrize("numel", [5, 48, 99])
def test_reduce_scatter_and_all_gather(n, numel):
    xs = _inputs(n, numel, seed=1)
    rs = collectives.reduce_scatter(xs)
    total = torch.stack(xs).sum(0)
    assert torch.equal(torch.cat(rs.outputs), total)
    chunk = -(-numel // n)
    for r in range(n):  # rank r owns chunk r, as torch.distributed.reduce_scatter_tensor says
        assert torch.equal(rs.outputs[r], total[r * chunk:(r + 1) * chunk])
        assert rs.bytes_sent(r) == rs.bytes_received(r) == (n - 1) / n * rs.padded_numel * 4
    shards = [torch.full((chunk,), float(r)) for r in range(n)]
    ag = collectives.all_gather(shards)
    assert all(torch.equal(o, torch.cat(shards)) for o in ag.outputs)
    for r in range(n):
        assert ag.bytes_sent(r) == ag.bytes_received(r) == costs.ring_bytes("all_gather", n * chunk * 4, n)
    assert rs.steps == ag.steps == n - 1


def test_ring_events_move_one_chunk_per_rank_per_step():
    res = collectives.all_reduce(_inputs(4, 8), record_states=True)
    for step in range(3):
        ev = [e for e in res.events if e.phase == "reduce-scatter" and e.step == step]
        assert sorted(e.src for e in ev) == [0, 1, 2, 3]
        assert all(e.dst == (e.src + 1) % 4 for e in ev)
        assert all(e.chunk == (e.src - step) % 4 for e in ev)
    # initial state plus one snapshot per step
    assert len(res.states) == 1 + 2 * 3
    assert torch.equal(res.states[-1][0], res.outputs[0])


def test_naive_scheme_loads_rank_zero():
    xs = _inputs(8, 16)
    res = collectives.naive_all_reduce(xs)
    assert all(torch.equal(o, torch.stack(xs).sum(0)) for o in res.outputs)
    assert res.bytes_sent(0) == costs.naive_all_reduce_bytes(64, 8) == 7 * 64
    assert res.bytes_sent(1) == 64
    ring = collectives.all_reduce(xs)
    assert res.bytes_sent(0) / ring.bytes_sent(0) == 8 / 2  # the naive root carries N/2 times more


@pytest.mark.parametrize("bad", [[], [torch.ones(2, 2)], [torch.ones(3), torch.ones(4)],
                                 [torch.ones(3), torch.ones(3, dtype=torch.int64)]])
def test_bad_inputs_are_refused(bad):
    with pytest.raises(ValueError):
        collectives.all_reduce(bad)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_switch_all_reduce_sends_the_buffer_once(n):
    xs = _inputs(n, 12)
    res = collectives.switch_all_reduce(xs)
    total = torch.stack(xs).sum(0)
    assert all(torch.equal(o, total) for o in res.outputs)
    assert all(res.bytes_sent(r) == res.bytes_received(r) == 48 for r in range(n))
    assert res.bytes_received(collectives.SWITCH) == res.bytes_sent(collectives.SWITCH) == n * 48
    # below the ring's bound for N > 2: the switch does the gathering and the spreading
    ring = costs.ring_bytes("all_reduce", 48, n)
    assert res.bytes_sent(0) / ring == pytest.approx(n / (2 * (n - 1)))
    assert (res.bytes_sent(0) < ring) == (n > 2)
    with pytest.raises(ValueError):
        collectives.switch_all_reduce([torch.ones(2), torch.ones(3)])
