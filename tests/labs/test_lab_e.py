"""Lab E (section 4.2, ZeRO-1 and FSDP from scratch): ``dpbook.labs.lab_e`` and its checker.

The judging is pure and tested on made-up measurements; one real launch checks that the
reference solution passes every item and that the all-reduce version fails only the bytes."""

import math

import pytest
import torch

from dpbook.costs import fsdp_step_bytes
from dpbook.labs.lab_e import BROKEN, MODEL_KWARGS, SOLUTION, build_model, checker, units
from dpbook.labs.lab_e.solution import owners
from dpbook.measure import StateBytes


def test_owners_balance_within_the_largest_parameter():
    params = [torch.empty(n) for n in (512, 32, 1024, 32, 1024, 32, 96, 3)]
    for world in (1, 2, 3, 4):
        owner = owners(params, world)
        load = [sum(p.numel() for p, r in zip(params, owner) if r == k) for k in range(world)]
        assert sum(load) == sum(p.numel() for p in params)
        assert max(load) <= sum(load) / world + max(p.numel() for p in params)
    assert owners(params, 2)[2] == 0 and owners(params, 2)[4] == 1  # largest first, lightest rank


def test_expected_counts_padding_and_the_formula():
    exp = checker.expected({}, 2)
    model = build_model()
    assert exp.num_params == sum(p.numel() for p in model.parameters()) == 2755
    assert exp.padding == 1  # only the head's bias (3 elements) is odd
    assert exp.state == exp.ledger_state + 16 * exp.padding / 2
    assert exp.volume == fsdp_step_bytes(4 * exp.padded_params, 2)
    assert exp.volume.total == pytest.approx(3 * (2 - 1) / 2 * 4 * exp.padded_params)
    assert exp.smallest_unit == MODEL_KWARGS["hidden"] * 3 + 3 == 99  # the head
    assert len(units(model)) == 4
    exp4 = checker.expected({}, 4)
    sizes = [p.numel() for p in model.parameters()]
    assert exp4.padded_params == sum(4 * math.ceil(s / 4) for s in sizes)


def _good(exp):
    v = exp.volume
    return {"max_diff": 0.0, "state": StateBytes(int(exp.state / 4), int(exp.state / 4),
                                                 int(exp.state / 2)),
            "volume": v, "kept": 3264, "plain_kept": 3264, "peak": 40_000, "ddp_peak": 63_000}


def test_fsdp_items_pass_and_fail_one_by_one():
    exp = checker.expected({}, 2)
    good = _good(exp)
    assert all(i.passed for i in checker.fsdp_items(good, exp))
    v = exp.volume
    cases = {
        "fsdp_weights": {"max_diff": 1e-3},
        "fsdp_bytes": {"volume": type(v)(v.all_gather_forward, 2 * v.all_gather_backward,
                                         v.reduce_scatter)},
        "fsdp_freed": {"kept": 3264 + 4 * exp.smallest_unit},
        "fsdp_peak": {"peak": 63_000},
        "fsdp_state": {"state": StateBytes(4 * exp.num_params, 0, 0)},
    }
    for key, change in cases.items():
        failed = [i.key for i in checker.fsdp_items({**good, **change}, exp) if not i.passed]
        assert failed == [key], (key, failed)
    # No regather in backward: right (and cheaper) when nothing was kept from the forward
    # (review G5), SHARD_GRAD_OP when the full parameters were kept.
    lazy = {**good, "volume": type(v)(v.all_gather_forward, 0.5 * v.all_gather_backward,
                                      v.reduce_scatter)}
    assert all(i.passed for i in checker.fsdp_items(lazy, exp))
    kept = {**lazy, "kept": 3264 + 4 * exp.smallest_unit}
    found = {i.key: i for i in checker.fsdp_items(kept, exp)}
    assert [k for k, i in found.items() if not i.passed] == ["fsdp_bytes", "fsdp_freed"]
    assert "SHARD_GRAD_OP" in found["fsdp_bytes"].hint
    # Kept at the last unit's start only (G4), after a whole step only (G3): each its own hint.
    mid = checker.fsdp_items({**good, "mid": 3072 + 4 * exp.smallest_unit, "plain_mid": 3072},
                             exp)[3]
    assert not mid.passed and "CHÍNH đơn vị" in mid.hint
    rest = checker.fsdp_items({**good, "rest_kept": 4 * exp.padded_params}, exp)[3]
    assert not rest.passed and "bước sau" in rest.hint
    # Adam hides a gradient N times too large; the first step's gradient does not.
    summed = checker.fsdp_items({**good, "grad_diff": 0.3, "grad_ratio": 2.0}, exp)[0]
    assert not summed.passed and "chia cho N" in summed.hint
    ar = type(v)(v.all_gather_forward, v.all_gather_backward, 0.0, 2 * v.reduce_scatter)
    assert "AllReduce" in checker.fsdp_items({**good, "volume": ar}, exp)[2].hint


def test_zero1_items():
    raw = {"max_diff": 0.0, "optimizer_bytes": [12_288, 9_752], "reference_bytes": 22_040,
           "largest_bytes": 8 * 1024}
    assert all(i.passed for i in checker.zero1_items(raw))
    full = checker.zero1_items({**raw, "optimizer_bytes": [22_040, 22_040]})
    assert [i.passed for i in full] == [True, False]
    empty = checker.zero1_items({**raw, "optimizer_bytes": [0, 0]})[1]
    assert not empty.passed and "self.state" in empty.hint
    # Review G6: a split in parameter order holds more than the greedy split's heaviest rank.
    greedy = {**raw, "greedy_bytes": [8 * n for n in checker.greedy_loads(
        [512, 32, 1024, 32, 1024, 32, 96, 3], 2)]}
    assert greedy["greedy_bytes"] == [12_288, 9_752] and checker.zero1_items(greedy)[1].passed
    item = checker.zero1_items({**greedy, "optimizer_bytes": [12_544, 9_496]})[1]
    assert not item.passed and "thứ tự tham số" in item.hint


def test_errors_and_missing_names_become_items():
    exp = checker.expected({}, 2)
    raw = {"path": "x.py", "missing": [],
           "zero1": {"error": "NotImplementedError: Bài E: hãy viết ShardedOptimizer.__init__."},
           "fsdp": {"error": "Traceback...\nRuntimeError: sai"}}
    found = checker.items(raw, exp)
    assert [i.passed for i in found] == [True] + [False] * 7
    assert "chưa viết" in found[1].hint and "RuntimeError: sai" in found[3].detail
    missing = checker.items({"path": "x.py", "missing": ["fully_shard_scratch"]}, exp)
    assert not any(i.passed for i in missing) and "thiếu fully_shard_scratch" in str(missing[0])


def test_check_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="Không thấy file"):
        checker.check(tmp_path / "nope.py")
    with pytest.raises(ValueError, match="world_size"):
        checker.check(SOLUTION, world_size=1)


def test_command_line_refuses_a_missing_or_broken_file(refuses_without_starting):
    refuses_without_starting("lab_e")


def test_one_launch_solution_passes_all_reduce_fails_bytes():
    good, bad = checker.check_files([SOLUTION, BROKEN["all_reduce"]], verbose=False)
    assert good.passed, str(good)
    assert bad.failed == ["fsdp_bytes"], str(bad)
    # judged against the workload the ranks ran (CPU or WORKLOADS["cuda"]), review D6
    assert good.expected == bad.expected == checker.expected_for(2)
    seen, exp = bad.raw["fsdp"]["volume"], bad.expected.volume
    assert seen.reduce_scatter == 0 and seen.all_reduce == 2 * exp.reduce_scatter


def test_expected_follows_the_device_the_run_picks(monkeypatch):
    """Review D6: on a GPU box the checker runs ``WORKLOADS["cuda"]`` (about 3,2 M parameters);
    what a page compares with must be counted on that model, not on the CPU one."""
    from dpbook import launch

    monkeypatch.setattr(launch, "plan", lambda *a, **k: launch.Plan("nccl", "cuda", 2, 2))
    gpu = checker.expected_for(2)
    assert gpu == checker.expected(checker.WORKLOADS["cuda"].model_kwargs, 2)
    assert gpu.num_params > 1000 * checker.expected({}, 2).num_params
    monkeypatch.setattr(launch, "plan", lambda *a, **k: launch.Plan("gloo", "cpu", 2, 0))
    assert checker.expected_for(2) == checker.expected({}, 2)


@pytest.fixture
def one_gloo_rank(tmp_path, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_references_free_the_fsdp2_model_before_measuring_ddp(one_gloo_rank, monkeypatch):
    """Review D13: ``del model, opt`` leaves the FSDP2 model alive (reference cycles); on a GPU
    its shards would count in DDP's peak. The references must collect it before the DDP run."""
    import gc
    import weakref

    from dpbook import measure, train
    from dpbook.launch import device

    seen, alive = [], []
    real_shard, real_peak = train.shard_blocks, measure.peak_memory

    def shard(model, *a, **k):
        seen.append(weakref.ref(model))
        return real_shard(model, *a, **k)

    def peak(run, *tracked):
        alive.append(seen[0]() is not None)
        return real_peak(run, *tracked)

    monkeypatch.setattr(train, "shard_blocks", shard)
    monkeypatch.setattr(measure, "peak_memory", peak)
    enabled = gc.isenabled()
    gc.disable()  # only an explicit collection may free the cycles
    try:
        checker.references(0, 1, checker.WORKLOADS["cpu"], device())
    finally:
        if enabled:
            gc.enable()
    assert alive == [False]
