"""Section 4.1.1: the average of per-rank gradients is the full-batch gradient, and the three
ways it stops being so (BatchNorm, uneven batches, summed losses)."""

import pytest
import torch
from torch import nn

from dpbook import averaging, launch, models, train
from dpbook.data import synthetic_regression
from dpbook.train import Parallel

B = 8  # micro-batch per rank in the distributed tests; the global batch is 2 * B


def _batch(n=8, seed=0):
    return tuple(t.double() for t in synthetic_regression(n, seed=seed).tensors)


def _max_diff(a, b):
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------------ models


def test_mlp_with_batchnorm_keeps_the_linear_weights():
    plain, bn = models.build_mlp(), models.build_mlp(norm="batch")
    assert sum(isinstance(m, nn.BatchNorm1d) for m in bn.modules()) == 3
    assert not any(isinstance(m, nn.BatchNorm1d) for m in plain.modules())
    bn_state = bn.state_dict()
    for name, value in plain.state_dict().items():
        assert torch.equal(bn_state[name], value), name
    assert bn(torch.randn(4, 16)).shape == (4, 4)


def test_mlp_refuses_an_unknown_norm():
    with pytest.raises(ValueError, match="norm"):
        models.MLP(norm="layer")


# ------------------------------------------------------------------------------ averaging


def test_equal_parts_plain_mean_is_the_full_gradient():
    x, y = _batch()
    mlp = models.build_mlp().double()
    full = averaging.local_gradients(mlp, x, y, [8])[0]
    for sizes in ([4, 4], [2, 2, 2, 2], [1] * 8):
        local = averaging.local_gradients(mlp, x, y, sizes)
        assert _max_diff(averaging.average(local), full) < 1e-12
    assert all(p.grad is None for p in mlp.parameters())


def test_uneven_parts_need_the_weighted_mean():
    x, y = _batch()
    mlp = models.build_mlp().double()
    full = averaging.local_gradients(mlp, x, y, [8])[0]
    local = averaging.local_gradients(mlp, x, y, [3, 5])
    assert _max_diff(averaging.average(local), full) > 1e-2
    assert _max_diff(averaging.average(local, [3, 5]), full) < 1e-12


def test_sum_reduction_scales_with_the_number_of_parts():
    x, y = _batch()
    mlp = models.build_mlp().double()
    full = averaging.local_gradients(mlp, x, y, [8], reduction="sum")[0]
    local = averaging.local_gradients(mlp, x, y, [4, 4], reduction="sum")
    assert _max_diff(2 * averaging.average(local), full) < 1e-12


def test_batchnorm_breaks_the_equality_layernorm_does_not():
    x, y = _batch()
    bn = models.build_mlp(norm="batch").double()
    full = averaging.local_gradients(bn, x, y, [8])[0]
    assert _max_diff(averaging.average(averaging.local_gradients(bn, x, y, [4, 4])), full) > 1e-2
    x2, y2 = (t.double() for t in synthetic_regression(8, 32, 256).tensors)
    ln = models.build_bucket_net().double()
    full = averaging.local_gradients(ln, x2, y2, [8])[0]
    assert _max_diff(averaging.average(averaging.local_gradients(ln, x2, y2, [4, 4])), full) < 1e-12


def test_sample_weights():
    plain = averaging.sample_weights([3, 5])
    assert plain[:3] == [1 / 6] * 3 and plain[3:] == [1 / 10] * 5
    assert sum(plain) == pytest.approx(1)
    assert averaging.sample_weights([3, 5], "weighted") == [1 / 8] * 8
    assert averaging.sample_weights([4, 4]) == averaging.sample_weights([4, 4], "weighted")


def test_combine_stats_is_the_full_batch_statistics():
    x = torch.randn(11, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    counts = [2, 4, 5]
    parts = torch.split(x, counts)
    means, variances = zip(*(averaging.batch_stats(p) for p in parts))
    mean, var = averaging.combine_stats(counts, means, variances)
    full_mean, full_var = averaging.batch_stats(x)
    assert _max_diff(mean, full_mean) < 1e-12 and _max_diff(var, full_var) < 1e-12
    # the mean of the variances alone underestimates the full variance
    assert bool((sum(v * c for v, c in zip(variances, counts)) / 11 < full_var).all())


def test_global_batch_size():
    assert averaging.global_batch_size(16, 4, 8) == 512
    assert averaging.global_batch_size(4, 8, 32) == 1024
    with pytest.raises(ValueError, match="accumulation_steps"):
        averaging.global_batch_size(16, 0, 8)


@pytest.mark.parametrize("call, match", [
    (lambda: averaging.check_sizes([]), "sizes"),
    (lambda: averaging.check_sizes([3, 0]), r"sizes\[1\]"),
    (lambda: averaging.sample_weights([2], "median"), "scheme"),
    (lambda: averaging.loss_fn(torch.zeros(1), torch.zeros(1), "max"), "reduction"),
    (lambda: averaging.average([torch.zeros(1)], [1, 2]), "kích thước"),
    (lambda: averaging.local_gradients(nn.Linear(1, 1), torch.zeros(3, 1), torch.zeros(3, 1),
                                       [1, 1]), "Tổng sizes"),
])
def test_bad_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------ fit(record=True)


def test_fit_records_the_first_gradient_in_one_process():
    res = train.fit(0, 1, None, steps=1, batch_size=8, record=True)
    x, y = _batch()
    expected = averaging.local_gradients(models.build_mlp().double(), x, y, [8])[0]
    assert _max_diff(res["grads"], expected) < 1e-12
    assert "bn" not in res
    bn = train.fit(0, 1, None, steps=1, batch_size=8, model_kwargs={"norm": "batch"}, record=True)
    s = bn["bn"]
    assert s["mean"].shape == (32,)
    assert _max_diff(s["mean"], s["global_mean"]) < 1e-12
    assert _max_diff(s["var"], s["global_var"]) < 1e-12


def test_fit_record_refuses_fsdp():
    with pytest.raises(ValueError, match="record"):
        train.fit(0, 2, Parallel("fsdp2"), record=True)


# ------------------------------------------------------------------------------ real ranks


@pytest.mark.distributed
def test_ddp_gradients_match_and_sum_reduction_is_n_times_smaller():
    ref = train.fit(0, 1, None, steps=3, batch_size=2 * B, record=True)
    res = launch.spawn(train.fit, Parallel("ddp"), steps=3, batch_size=B, world_size=2,
                       backend="gloo", record=True, output="none")
    for r in res:
        assert _max_diff(r["grads"], ref["grads"]) < 1e-12
    ref_sum = train.fit(0, 1, None, steps=1, batch_size=2 * B, reduction="sum", record=True)
    res_sum = launch.spawn(train.fit, Parallel("ddp"), steps=1, batch_size=B, world_size=2,
                           backend="gloo", reduction="sum", record=True, output="none")
    ratio = torch.linalg.norm(ref_sum["grads"]) / torch.linalg.norm(res_sum[0]["grads"])
    assert ratio.item() == pytest.approx(2, abs=1e-12)


@pytest.mark.distributed
def test_batchnorm_under_ddp_differs_and_allreduced_stats_match():
    bn = {"norm": "batch"}
    ref = train.fit(0, 1, None, steps=3, batch_size=2 * B, model_kwargs=bn, record=True)
    res = launch.spawn(train.fit, Parallel("ddp"), steps=3, batch_size=B, world_size=2,
                       backend="gloo", model_kwargs=bn, record=True, output="none")
    params = [n for n, _ in models.build_mlp(**bn).named_parameters()]
    assert max(_max_diff(res[0]["state"][k], ref["state"][k]) for k in params) > 1e-3
    assert all(_max_diff(res[0]["state"][k], res[1]["state"][k]) == 0 for k in params)
    full = ref["bn"]
    for r in res:
        assert _max_diff(r["bn"]["mean"], full["mean"]) > 1e-2
        assert _max_diff(r["bn"]["global_mean"], full["mean"]) < 1e-12
        assert _max_diff(r["bn"]["global_var"], full["var"]) < 1e-12


@pytest.mark.distributed
def test_syncbatchnorm_runs_on_gpus_or_is_refused_on_cpu():
    mode = launch.plan(2)
    kwargs = dict(steps=2, batch_size=B, world_size=2, model_kwargs={"norm": "batch"},
                  sync_batchnorm=True, output="none")
    if mode.backend == "nccl":
        ref = train.fit(0, 1, None, steps=2, batch_size=2 * B, model_kwargs={"norm": "batch"})
        res = launch.spawn(train.fit, Parallel("ddp"), **kwargs)
        for k, v in ref["state"].items():
            assert _max_diff(res[0]["state"][k].double(), v.double()) < 1e-10, k
    else:
        with pytest.raises(launch.RankError, match="SyncBatchNorm"):
            launch.spawn(train.fit, Parallel("ddp"), **kwargs)
