"""Section 4.1.5 (Ring AllReduce): the parameter-server formula in ``costs``, the all-reduce
benchmark in ``dpbook.bench``, and the lower-bound facts the page checks on the simulator."""

import math
from collections import Counter

import pytest
import torch

from dpbook import bench, collectives, costs, launch


@pytest.mark.parametrize("world_size", [2, 4, 8, 64])
def test_bench_row_bandwidths_follow_nccl_tests(world_size):
    row = bench.BenchRow(nbytes=10**6, seconds=2e-3, world_size=world_size)
    assert row.algbw == 10**6 / 2e-3
    factor = costs.busbw_factor("all_reduce", world_size)
    assert row.factor == factor == 2 * (world_size - 1) / world_size
    assert row.busbw == row.algbw * costs.busbw_factor("all_reduce", world_size)
    # busbw is the rate at which one rank pushes its ring bytes
    assert math.isclose(row.busbw, costs.ring_bytes("all_reduce", 10**6, world_size) / 2e-3)


def test_busbw_equals_beta_in_the_bandwidth_regime():
    beta = 50e9
    for n in (2, 8, 64):
        t = costs.alpha_beta_time("all_reduce", 1e9, n, alpha=0.0, bandwidth=beta)
        assert math.isclose(bench.BenchRow(10**9, t, n).busbw, beta)


def test_fit_alpha_beta():
    n, alpha, beta = 4, 20e-6, 2e9
    rows = [bench.BenchRow(s, costs.alpha_beta_time("all_reduce", s, n, alpha, beta), n)
            for s in (10**3, 10**5, 10**8)]
    a_hat, b_hat = bench.fit_alpha_beta(rows)
    assert a_hat == pytest.approx(alpha, rel=0.01)  # 1 kB is almost pure latency
    assert b_hat == pytest.approx(beta, rel=0.01)  # 100 MB is almost pure bandwidth
    # the fastest time, not the smallest size, is taken as the latency
    noisy = [bench.BenchRow(10**3, 1e-3, n), bench.BenchRow(10**4, 4e-4, n), rows[-1]]
    assert bench.fit_alpha_beta(noisy)[0] == 4e-4 / (2 * (n - 1))
    with pytest.raises(ValueError):
        bench.fit_alpha_beta([])
    with pytest.raises(ValueError):
        bench.fit_alpha_beta([bench.BenchRow(4, 1.0, 2), bench.BenchRow(4, 1.0, 4)])
    with pytest.raises(ValueError):
        bench.fit_alpha_beta([bench.BenchRow(4, 1.0, 1)])  # one rank: no latency steps to fit


@pytest.mark.parametrize("sizes", [(), (0,), (6,), (1000, 1002), (-4,), (4.0,)])
def test_time_all_reduce_rejects_bad_sizes_before_any_collective(sizes):
    # raises before touching torch.distributed: no process group needed
    with pytest.raises(ValueError):
        bench.time_all_reduce(0, 2, sizes=sizes)


@pytest.mark.parametrize("kw", [{"warmup": -1}, {"repeats": 0}])
def test_time_all_reduce_rejects_bad_counts(kw):
    with pytest.raises(ValueError):
        bench.time_all_reduce(0, 2, sizes=(1000,), **kw)


def test_parameter_server_bytes():
    psi = 1e9
    one = costs.parameter_server_bytes(psi, 64, 1)
    assert (one.worker, one.server, one.busiest) == (psi, 64 * psi, 64 * psi)
    # one dedicated server carries one buffer more than rank 0 of the naive scheme
    assert one.server == costs.naive_all_reduce_bytes(psi, 64) + psi
    many = costs.parameter_server_bytes(psi, 64, 64)
    assert many.server == many.worker == many.busiest == psi
    assert costs.parameter_server_bytes(psi, 64, 32).server == 2 * psi
    # servers needed so that none is busier than a ring rank: ceil(N^2 / (2(N-1)))
    for n in (4, 8, 64):
        ring = costs.ring_bytes("all_reduce", psi, n)
        need = min(k for k in range(1, n + 1)
                   if costs.parameter_server_bytes(psi, n, k).server <= ring)
        assert need == math.ceil(n * n / (2 * (n - 1)))
    for bad in ({"num_servers": 0}, {"world_size": 0}, {"nbytes": -1}):
        with pytest.raises(ValueError):
            costs.parameter_server_bytes(**({"nbytes": psi, "world_size": 4} | bad))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_every_position_moves_2n_minus_2_times_ring_and_naive_alike(n):
    x = [torch.ones(5 * n) for _ in range(n)]
    ring, naive = collectives.all_reduce(x), collectives.naive_all_reduce(x)
    s = 4 * 5 * n
    counts = Counter(e.chunk for e in ring.events)
    assert set(counts.values()) == {2 * (n - 1)}
    total = 2 * (n - 1) * s
    assert sum(e.nbytes for e in ring.events) == sum(e.nbytes for e in naive.events) == total
    # the lower bound on the busiest rank is met by every ring rank, missed by naive rank 0
    bound = 2 * (n - 1) / n * s
    assert all(ring.bytes_sent(r) == ring.bytes_received(r) == bound for r in range(n))
    assert naive.bytes_received(0) == (n - 1) * s >= bound


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_each_ring_phase_sends_what_its_own_collective_would(n):
    """4.1.5: the ring's reduce-scatter phase and all-gather phase each send (N-1)/N of the
    buffer per rank (the simulator's events against ``costs.ring_bytes``)."""
    size = 4 * 6 * n
    sim = collectives.all_reduce([torch.ones(6 * n) for _ in range(n)])
    for rank in range(n):
        for phase, coll in (("reduce-scatter", "reduce_scatter"), ("all-gather", "all_gather")):
            sent = sum(e.nbytes for e in sim.events if e.phase == phase and e.src == rank)
            assert sent == costs.ring_bytes(coll, size, n)


@pytest.mark.distributed
def test_time_all_reduce_on_two_ranks():
    sizes = (1000, 100_000)
    results = launch.spawn(bench.time_all_reduce, world_size=2, backend="gloo", sizes=sizes,
                           warmup=1, repeats=3, timeout=120, output="none")
    rows = results[0]["rows"]
    assert results[0]["backend"] == "gloo"
    assert all(r["rows"] == rows for r in results)  # max over ranks, then median: the same
    assert [r.nbytes for r in rows] == list(sizes)
    assert all(r.seconds > 0 and r.algbw > 0 and r.world_size == 2 for r in rows)
    assert all(r.busbw == r.algbw * costs.busbw_factor("all_reduce", 2) for r in rows)
