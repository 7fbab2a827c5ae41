"""``dpbook.buckets``: DDP's first-iteration layout (``initial_buckets``), the step that rebuilds,
and the layout of each step, against PyTorch's own functions and against real DDP (gloo, two
ranks, one launch for every model and setting)."""

import random
import sys

import pytest
import torch
import torch.distributed as dist
from dpbook import buckets
from dpbook.pages import bucket_overlap
from dpbook.tracing import ddp_run
from torch.nn.parallel import distributed as ddp_mod

S = buckets.DdpSetting
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16}
SETTINGS = (S(), S(0.1), S(None, find_unused_parameters=True), S(0.02, find_unused_parameters=True),
            S(0.1, 0.02), S(0.01, 0.005, find_unused_parameters=True),
            S(0.02, 0.01, static_graph=True), S(0.05, static_graph=True,
                                                find_unused_parameters=True))


def _config(setting):
    return ddp_mod._BucketCapacityConfig.create(
        bucket_cap_mb=setting.bucket_cap_mb, use_python_reducer=False,
        bucket_cap_mb_list=None if setting.first_bucket_cap_mb is None else
        [setting.first_bucket_cap_mb,
         ddp_mod._DEFAULT_BUCKET_CAP_MB if setting.bucket_cap_mb is None else setting.bucket_cap_mb])


def _torch_initial(params, setting):
    """What ``_ddp_init_helper`` hands the reducer: the packing in registration order (no
    ``tensor_indices``), the list of buckets reversed."""
    limits, _ = _config(setting).compute_bucket_size_limits(setting.static_graph,
                                                            setting.find_unused_parameters)
    tensors = [torch.empty(p.numel, dtype=DTYPES[p.dtype]) for p in params]
    idx, lim = dist._compute_bucket_assignment_by_size(tensors, limits, [p.sparse for p in params])
    return [tuple(b) for b in reversed(idx)], list(reversed(lim))


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.call())
def test_initial_limits_are_compute_bucket_size_limits(setting):
    limits, _ = _config(setting).compute_bucket_size_limits(setting.static_graph,
                                                            setting.find_unused_parameters)
    assert buckets.initial_limits(setting) == limits


def test_ddp_init_helper_reverses_the_list_of_buckets():
    import inspect
    src = inspect.getsource(ddp_mod.DistributedDataParallel._ddp_init_helper)
    assert "list(reversed(bucket_indices))" in src
    assert "dist._compute_bucket_assignment_by_size(\n            parameters," in src
    build = inspect.getsource(ddp_mod.DistributedDataParallel._build_params_for_reducer)
    assert "self.module.named_modules()" in build and "if param.requires_grad" in build
    assert "if p not in memo and not memo.add(p)" in build


@pytest.mark.parametrize("name", list(bucket_overlap.PROBES))
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.call())
def test_initial_buckets_equal_torch_on_the_probes(name, setting):
    params, _ = bucket_overlap.probe_params(bucket_overlap.PROBES[name])
    ours = buckets.initial_buckets(params, setting)
    assert ([b.params for b in ours], [b.limit for b in ours]) == _torch_initial(params, setting)
    assert [b.index for b in ours] == list(range(len(ours)))


@pytest.mark.parametrize("seed", range(15))
def test_initial_buckets_equal_torch_with_mixed_dtypes_and_sparse(seed):
    # without tensor_indices the C++ packing sorts the buckets by their smallest index, so the
    # order stays defined when several dtypes interleave
    rng = random.Random(seed)
    params = [buckets.Param(f"p{i}", f"l{i}", rng.choice([1, 7, 300, 4096, 20000]),
                            rng.choice(["float32", "float32", "float64", "float16"]),
                            sparse=rng.random() < 0.1) for i in range(rng.randint(1, 25))]
    setting = S(rng.choice([0.001, 0.01, 0.05]), rng.choice([None, 0.0005, 0.005]),
                find_unused_parameters=True)
    ours = buckets.initial_buckets(params, setting)
    assert ([b.params for b in ours], [b.limit for b in ours]) == _torch_initial(params, setting)


def test_initial_layout_of_bucketnet_is_not_a_reverse_walk():
    params, order = bucket_overlap.probe_params(bucket_overlap.PROBES["BucketNet"])
    first = buckets.initial_buckets(params, S(0.1, 0.02))
    assert [params[i].name for i in first[0].params] == ["b2.fc2.bias", "head.weight", "head.bias"]
    walk = buckets.assign_buckets(params, S(0.1, 0.02).limits, list(range(len(params)))[::-1])
    assert [params[i].name for i in walk[0].params] == ["head.bias", "head.weight"]
    assert first[-1].limit == int(0.02 * 2**20) and order[-1] in first[-1].params
    assert [b.params for b in buckets.initial_buckets(params, S())] == [tuple(range(22))]
    assert buckets.initial_buckets(params, S())[0].limit == sys.maxsize


def test_probe_models_parameter_lists():
    p = bucket_overlap.PROBES
    tied, _ = bucket_overlap.probe_params(p["GPT2 nhỏ (wte = lm_head)"])
    assert tied[0].name == "wte.weight" and "lm_head.weight" not in [x.name for x in tied]
    frozen, _ = bucket_overlap.probe_params(p["BucketNet, b1 đóng băng"])
    assert not any(x.layer.startswith("b1") for x in frozen) and len(frozen) == 22 - 6
    ng, ng_order = bucket_overlap.probe_params(p["Nguoc"])
    assert [ng[i].layer for i in ng_order] == ["head", "head", "body", "body", "inp", "inp"]


def test_step_buckets_follow_rebuild_step():
    params, order = bucket_overlap.probe_params(bucket_overlap.PROBES["Nguoc"])
    for setting in SETTINGS:
        at = buckets.rebuild_step(setting)
        for step in range(1, 5):
            got = buckets.step_buckets(params, setting, order, step)
            want = (buckets.initial_buckets(params, setting) if at is None or step < at
                    else buckets.rebuilt_buckets(params, setting, order))
            assert got == want
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="step phải là số nguyên"):
            buckets.step_buckets(params, S(), order, bad)


def test_gpt2_meta_ready_order_is_the_cpu_one():
    model = bucket_overlap.build_tiny_gpt2()
    with torch.device("meta"):
        meta = bucket_overlap.GPT2LM(**bucket_overlap.TINY_GPT2)
    assert bucket_overlap.gpt2_ready_order(meta) == bucket_overlap.gpt2_ready_order(model)


def test_gpt2_layout_equals_torch_on_the_ready_order():
    params = bucket_overlap.gpt2_params()
    order = bucket_overlap.gpt2_ready_order()
    assert len(params) == 148 and sum(p.numel for p in params) == 124_439_808
    assert params[order[-1]].name == "wte.weight"  # tied: ready when the embedding is done too
    ours = buckets.rebuilt_buckets(params, S(), order)
    tensors = [torch.empty(params[i].numel, device="meta") for i in order]
    idx, lim = dist._compute_bucket_assignment_by_size(
        tensors, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20], [False] * len(params), order)
    assert [list(b.params) for b in ours] == [list(b) for b in idx]
    assert [b.limit for b in ours] == list(lim)


# ------------------------------------------------------------------------------ real DDP

CASES = tuple((probe, s) for probe in bucket_overlap.PROBES.values()
              for s in (S(), S(0.02, find_unused_parameters=True), S(0.1, 0.02),
                        S(0.01, 0.005, find_unused_parameters=True),
                        S(0.02, 0.01, static_graph=True)))


@pytest.fixture(scope="module")
def layout_runs():
    return ddp_run.rebuild_runs(CASES, steps=3, output="none")


@pytest.mark.distributed
def test_every_step_of_real_ddp_uses_step_buckets(layout_runs):
    assert len(layout_runs) == len(CASES) == 20
    for (probe, setting), run in zip(CASES, layout_runs):
        params, order = bucket_overlap.probe_params(probe)
        assert run.model == probe.name and run.setting == setting
        assert list(run.params) == params and run.ready_order == tuple(order)
        assert run.rebuilt_at == buckets.rebuild_step(setting)
        for step, layout in enumerate(run.steps, start=1):
            want = [b.params for b in buckets.step_buckets(params, setting, order, step)]
            assert list(layout) == want, (probe.name, setting.call(), step)


@pytest.mark.distributed
def test_real_first_step_of_nguoc_with_find_unused_parameters(layout_runs):
    # declared first, used last: B0 is inp.bias, ready last, and DDP never rebuilds
    (run,) = [r for (p, s), r in zip(CASES, layout_runs)
              if p.name == "Nguoc" and s == S(0.02, find_unused_parameters=True)]
    names = [[run.params[i].name for i in b] for b in run.steps[0]]
    assert names == [["inp.bias"], ["head.bias", "body.weight", "body.bias", "inp.weight"],
                     ["head.weight"]]
    assert run.steps[-1] == run.steps[0] and run.rebuilt_at is None


def test_rebuild_runs_refuse_bad_cases():
    with pytest.raises(ValueError, match="Probe, DdpSetting"):
        ddp_run.rebuild_runs([(0.1, None)])
    with pytest.raises(ValueError, match="Probe cần"):
        ddp_run.Probe("x", None, None)
