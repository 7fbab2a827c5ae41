"""Section 4.1.4 (buckets and overlap): the alpha-beta argument in ``dpbook.pages.bucket_overlap`` and
gradient accumulation with ``no_sync`` in ``dpbook.accumulation``."""

import matplotlib
import pytest
import torch

from dpbook import accumulation, buckets, costs, data, launch, overlap, shapes
from dpbook.averaging import flat_grad, loss_fn
from dpbook.models import build_bucket_net
from dpbook.pages import bucket_overlap
from dpbook.widgets import ddp_buckets

matplotlib.use("Agg")


@pytest.mark.parametrize("n, alpha, beta", [(2, 50e-6, 1e9), (8, 5e-6, 100e9), (64, 1e-6, 2e10)])
def test_half_size_balances_latency_and_transfer(n, alpha, beta):
    half = overlap.half_size(n, alpha, beta)
    assert half == pytest.approx(n * alpha * beta)
    t = costs.alpha_beta_time("all_reduce", half, n, alpha, beta)
    assert t == pytest.approx(2 * 2 * (n - 1) * alpha)  # latency == transfer at n_1/2
    assert overlap.transfer_share(half, n, alpha, beta) == pytest.approx(0.5)
    for size in (1, 10**3, 10**6, 10**9):
        t = costs.alpha_beta_time("all_reduce", size, n, alpha, beta)
        xfer = costs.ring_bytes("all_reduce", size, n) / beta
        assert overlap.transfer_share(size, n, alpha, beta) == pytest.approx(xfer / t)


def test_transfer_share_edges():
    assert overlap.transfer_share(0) == 0.0
    assert overlap.transfer_share(1e12) > 0.999
    assert overlap.transfer_share(10, alpha=0.0) == 1.0


@pytest.mark.parametrize("kwargs", [dict(world_size=1), dict(alpha=-1.0), dict(bandwidth=0.0),
                                    dict(world_size=2.5)])
def test_half_size_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        overlap.half_size(**kwargs)


def test_transfer_share_rejects_negative_bytes():
    with pytest.raises(ValueError, match="nbytes"):
        overlap.transfer_share(-1)


@pytest.mark.parametrize("cap", [1e-4, 0.02, 0.1, 0.3, None])
def test_bucket_lower_bound_holds(cap):
    params, order = ddp_buckets.demo_params()
    tl = overlap.alpha_beta_timeline(params, buckets.cap_limits(cap), order)
    bound = overlap.bucket_lower_bound(tl)
    t = [costs.alpha_beta_time("all_reduce", b.nbytes, overlap.DEFAULT_WORLD_SIZE, overlap.DEFAULT_ALPHA,
                               overlap.DEFAULT_BANDWIDTH) for b in tl.buckets]
    assert bound == max(tl.compute_end + t[-1], sum(t))
    assert bound <= tl.total + 1e-15


def test_cap_sweep_ends_are_the_naive_strategies():
    params, order = ddp_buckets.demo_params()
    cmp = overlap.compare_strategies(params, buckets.cap_limits(0.1), order)
    sweep = overlap.cap_sweep(params, order, [1e-4, 0.1, 10.0])
    assert [n for _, n, _ in sweep] == [len(params), cmp.n_buckets, 1]
    assert [t for _, _, t in sweep] == [cmp.per_param, cmp.buckets, cmp.no_overlap]


def test_figure_draws():
    import matplotlib.pyplot as plt

    params, order = ddp_buckets.demo_params()
    fig = bucket_overlap.cap_sweep_figure(params, order, [1e-3, 0.1, 1.0])
    assert fig.axes[0].get_xlabel() == "bucket_cap_mb (MiB)"
    plt.close("all")


def test_nguocs_first_buckets_fill_last_first_so_nothing_overlaps():
    """Exercise 4 (audit X4): with ``find_unused_parameters=True`` the declaration-order layout
    puts ``inp.weight``, the last gradient of the backward, in B1, and ``inp.bias`` alone in B0;
    B2 (``head.weight``) is ready first but waits for both, launched in index order."""
    model = bucket_overlap.Nguoc()
    params = buckets.model_params(model)
    real = list(buckets.ready_order(model, torch.randn(4, 32)))
    first = buckets.initial_buckets(params, buckets.DdpSetting(0.02, find_unused_parameters=True))
    ready_at = [max(real.index(i) for i in b.params) for b in first]
    assert [params[i].name for i in real] == ["head.bias", "head.weight", "body.bias",
                                              "body.weight", "inp.bias", "inp.weight"]
    assert ready_at == [len(real) - 2, len(real) - 1, 1]


def test_micro_batches_partition_the_global_batch():
    n, k, b = 3, 4, 5
    x, y = accumulation.global_batch(n, k, b)
    assert x.shape == (n * k * b, 32) and y.shape == (n * k * b, accumulation.OUT_DIM)
    assert x.dtype == y.dtype == torch.float64
    index = torch.arange(len(x))
    rows = sorted(i for r in range(n) for s in range(k)
                  for i in data.rank_batch((index,), r, b, x.device, start=s * n * b)[0].tolist())
    assert rows == list(range(len(x)))


def test_reference_is_the_mean_of_micro_batch_gradients():
    """The arithmetic behind no_sync, in one process: the mean of the per-micro-batch
    gradients (what DDP's averaged accumulation computes) is the global-batch gradient."""
    n, k, b = 2, 3, 4
    model = build_bucket_net().double()
    x, y = accumulation.global_batch(n, k, b)
    for r in range(n):
        for s in range(k):
            xs, ys = data.rank_batch((x, y), r, b, x.device, start=s * n * b)
            (loss_fn(model(xs), ys) / (k * n)).backward()
    summed = flat_grad(model)
    assert torch.allclose(summed, accumulation.reference_gradient(n, k, b), atol=1e-12, rtol=0)


def test_accumulate_worker_rejects_bad_modes():
    with pytest.raises(ValueError, match="modes"):
        accumulation.accumulate_worker(0, 2, modes=("tắt",))
    with pytest.raises(ValueError, match="accumulation_steps"):
        accumulation.accumulate_worker(0, 2, accumulation_steps=0)


@pytest.mark.distributed
def test_no_sync_skips_every_allreduce_but_the_last():
    k, b = 3, 4
    out = launch.spawn(accumulation.accumulate_worker, world_size=2, backend="gloo", output="none",
                       accumulation_steps=k, micro_batch=b)
    model = build_bucket_net().double()
    params = buckets.model_params(model)
    order = buckets.ready_order(model, torch.randn(2, 32, dtype=torch.float64))
    bucket_bytes = [bk.nbytes for bk in buckets.assign_buckets(params, buckets.cap_limits(None), order)]
    reference = accumulation.reference_gradient(2, k, b)
    for r in out:
        psi = r["grad_bytes"]
        assert psi == sum(bucket_bytes) == 8 * sum(p.numel for p in params)
        no_sync = r["runs"]["no_sync"]["records"]
        assert all(recs == [] for recs in no_sync[:-1])
        assert [x.nbytes for x in no_sync[-1]] == bucket_bytes
        assert {x.collective for x in no_sync[-1]} == {"all_reduce"}
        for mode in ("sync_every", "no_sync_backward_only"):
            records = r["runs"][mode]["records"]
            assert all([x.nbytes for x in recs] == bucket_bytes for recs in records)
        for mode in accumulation.MODES:
            assert torch.allclose(r["runs"][mode]["grad"], reference, atol=1e-12, rtol=0)
    for mode in accumulation.MODES:
        assert torch.equal(out[0]["runs"][mode]["grad"], out[1]["runs"][mode]["grad"])


def test_gpt2_params_are_the_presets_tensors_without_memory():
    gpt2 = bucket_overlap.gpt2_params()
    assert sum(p.numel for p in gpt2) == shapes.presets()[bucket_overlap.GPT2].num_params
    assert {p.device for p in gpt2} == {"meta"} and len(gpt2) == 148


@pytest.mark.distributed
def test_the_pages_accumulation_run_matches_its_parts():
    run = bucket_overlap.accumulation_run(2, 2, 4)
    assert run.mode == launch.describe_mode(2)
    assert [r["rank"] for r in run.ranks] == [0, 1]
    assert torch.equal(run.reference, accumulation.reference_gradient(2, 2, 4))
    # the float64 model's default buckets: what DDP reduced in the last micro-batch
    last = run.ranks[0]["runs"]["no_sync"]["records"][-1]
    assert [r.nbytes for r in last] == [b.nbytes for b in run.default_buckets]


def test_report_texts_are_vietnamese_numbers():
    params, order = ddp_buckets.demo_params()
    tl = overlap.alpha_beta_timeline(params, buckets.cap_limits(0.1, 0.02), order)
    text = bucket_overlap.timeline_text("x", tl)
    assert "66\u202f560" in text and "0,17 ms" in text and "1,60 ms" in text and "0,21 ms" in text
    layout = bucket_overlap.layout_text(params, [b.params for b in tl.buckets])
    assert layout.startswith("B0 head 65,0 KiB | B1 b2.fc2")
    assert layout.count("|") == len(tl.buckets) - 1


@pytest.mark.parametrize("cap_list", [None, [0.02, 0.1]])
@pytest.mark.parametrize("find_unused", [False, True])
@pytest.mark.parametrize("static_graph", [False, True])
def test_step_one_is_a_single_bucket_except_with_a_cap_list_or_unused_parameters(
        cap_list, find_unused, static_graph):
    """4.1.4's rule 5 and the ddp-buckets page: the first step puts every gradient in one bucket
    unless bucket_cap_mb_list is given or find_unused_parameters=True without static_graph=True
    (then the declaration-order layout), as PyTorch computes the first step's limits."""
    import sys

    from torch.nn.parallel import distributed as ddp_impl

    cfg = ddp_impl._BucketCapacityConfig.create(bucket_cap_mb=None, bucket_cap_mb_list=cap_list,
                                                use_python_reducer=False)
    limits, _ = cfg.compute_bucket_size_limits(static_graph=static_graph,
                                               find_unused_parameters=find_unused)
    declaration_order = cap_list is not None or (find_unused and not static_graph)
    assert (limits == [sys.maxsize]) == (not declaration_order)
