"""Labs B and C (``dpbook.labs.compare``): several wrappings measured in one launch, against the
ledger and the cost formulas.

The distributed test uses the chapter's small ``MLP(16, 32, depth=3, 4)``: every FSDP unit and
every row dimension divides by 4, so no shard is padded and the equalities are exact.
"""

import matplotlib
import pytest

from dpbook.labs import compare
from dpbook import costs, launch, memory
from dpbook.train import Parallel

matplotlib.use("Agg")

TINY = compare.Workload({"in_dim": 16, "hidden": 32, "depth": 3, "out_dim": 4}, 4, 1)
ALL = compare.LAB_C + (Parallel("ddp"), Parallel("fsdp2"))


def test_workload_by_device_and_validation():
    cpu, cuda = compare.workload("cpu"), compare.workload("cuda")
    assert cpu.model_kwargs["hidden"] < cuda.model_kwargs["hidden"]
    with pytest.raises(ValueError, match="device_type"):
        compare.workload("tpu")


def test_model_numbers_on_meta():
    n = compare.model_numbers(compare.workload("cpu").model_kwargs)
    # 64->256, 3 x 256->256, head 256->8
    assert n.num_params == (64 * 256 + 256) + 3 * (256 * 256 + 256) + (256 * 8 + 8)
    assert n.root_params == 256 * 8 + 8 and n.largest_unit == 256 * 256 + 256


@pytest.mark.parametrize("par, strategy", [
    (Parallel("ddp"), "DDP"), (Parallel("fsdp1", strategy="NO_SHARD"), "NO_SHARD"),
    (Parallel("fsdp2"), "FULL_SHARD"),
    (Parallel("fsdp2", reshard_after_forward=False), "SHARD_GRAD_OP"),
    (Parallel("fsdp2", shard_size=2), "HYBRID_SHARD"),
    (Parallel("fsdp1", strategy="HYBRID_SHARD", shard_size=2), "HYBRID_SHARD")])
def test_ledger_strategy(par, strategy):
    assert par.ledger_strategy == strategy


def test_predict_uses_ledger_and_costs():
    p, root, unit = 1000, 40, 300
    full = compare.predict(Parallel("fsdp1", strategy="FULL_SHARD"), p, 4, root, unit)
    assert full.rest == memory.vram_ledger(p, 4, "FULL_SHARD")
    # in the step: the shard, plus the largest block and the root unit, both gathered in full
    assert full.step.params == 4 * p / 4 + 4 * (unit + root) * 3 / 4
    assert full.volume == costs.fsdp_step_bytes(4 * p, 4, "FULL_SHARD", root_bytes=4 * root)
    # FSDP2 with reshard_after_forward=True reshards the root too: the textbook 3(N-1)/N Psi
    true = compare.predict(Parallel("fsdp2", reshard_after_forward=True), p, 4, root, unit)
    assert true.volume.total == 3 * 3 / 4 * 4 * p
    # ... but it still holds the root during the step, as FSDP2's default does
    default = compare.predict(Parallel("fsdp2"), p, 4, root, unit)
    assert true.step == default.step == full.step
    # SHARD_GRAD_OP holds every parameter in full, the root included: nothing to add
    for par in (Parallel("fsdp1", strategy="SHARD_GRAD_OP"),
                Parallel("fsdp2", reshard_after_forward=False)):
        assert compare.predict(par, p, 4, root, unit).step.params == 4 * p
    for par in (Parallel("ddp"), Parallel("fsdp1", strategy="NO_SHARD")):
        assert compare.predict(par, p, 4, root, unit).step.params == 4 * p
    hybrid = compare.predict(Parallel("fsdp1", strategy="HYBRID_SHARD", shard_size=2), p, 4, root,
                             unit)
    assert hybrid.rest.state == 16 * p / 2
    assert hybrid.step.params == 4 * p / 2 + 4 * (unit + root) / 2  # gathered inside S = 2
    assert hybrid.volume.all_reduce == costs.ring_bytes("all_reduce", 4 * p / 2, 2)
    assert compare.predict(Parallel("ddp"), p, 4).volume == costs.ddp_step_bytes(4 * p, 4)
    with pytest.raises(ValueError, match="world_size"):
        compare.predict(Parallel("ddp"), p, 0)
    with pytest.raises(ValueError, match="root_unit_params"):  # the ledger checks the counts
        compare.predict(Parallel("fsdp2"), p, 4, root_params=p, largest_unit=unit)


def test_held_params_is_for_fsdp_only():
    with pytest.raises(ValueError, match="par.method"):
        compare.held_params(None, Parallel("ddp"))


def test_lab_backend_on_this_machine():
    expected = "auto" if launch.plan(4).backend == "nccl" else "gloo"
    assert compare.lab_backend(4) == expected


@pytest.mark.distributed
def test_one_launch_measures_every_configuration():
    results = launch.spawn(compare.measure_configs, ALL, wl=TINY, world_size=4, backend="gloo",
                           timeout=240, output="none")
    rows = {r.label: r for r in compare.collect(results, ALL)}
    n = compare.model_numbers(TINY.model_kwargs)
    for r in rows.values():
        assert r.num_params == n.num_params and r.world_size == 4 and r.global_batch == 16
        assert r.state == r.predicted.rest  # bytes allocated and held between steps = the ledger
        assert r.volume == r.predicted.volume  # measured bytes per step = costs
        assert r.peak >= r.state.state and r.peak_method == "memtracker"
        assert r.throughput == pytest.approx(16 / r.step_time)
    # DDP's bucket copy of the gradients, measured where it is allocated (the census), is its
    # own row: 4P, as many bytes as the gradients; FSDP has none between steps
    assert rows["DDP"].state.buffers == rows["DDP"].state.grads == 4 * n.num_params
    assert all(r.state.buffers == 0 for k, r in rows.items() if k != "DDP")
    peak = {compare.SHORT[k]: r.peak for k, r in rows.items()}
    assert peak["FULL_SHARD"] < peak["SHARD_GRAD_OP"] < peak["NO_SHARD"]
    assert peak["FULL_SHARD"] < peak["HYBRID_SHARD (2)"] < peak["NO_SHARD"]
    # HYBRID_SHARD on a 2 x 2 mesh: shard collectives inside {0, 1}, AllReduce across {0, 2}
    hyb = rows["FSDP1 HYBRID_SHARD"].by_group
    assert set(hyb) == {(0, 1), (0, 2)}
    assert set(hyb[(0, 1)]) == {"all_gather", "reduce_scatter"}
    ar = costs.ring_bytes("all_reduce", 4 * n.num_params / 2, 2)
    assert hyb[(0, 2)] == {"all_reduce": ar}
    assert rows["DDP"].by_group == {(0, 1, 2, 3): {"all_reduce": rows["DDP"].volume.total}}
    text = compare.table(list(rows.values())) + compare.comm_table(list(rows.values()))
    assert "HYBRID_SHARD (2)" in text and "công thức" in text
    fig = compare.figure_strategies(list(rows.values()))
    assert [ax.get_title() for ax in fig.axes] == ["Bộ nhớ đỉnh", "Giao tiếp mỗi bước",
                                                   "Thời gian một bước (trung vị)"]
    # During the step (``held_in_step``): the root unit is unsharded at both moments in every
    # FSDP configuration, and at the last block's forward a rank holds exactly what the in-step
    # ledger counts plus its own shard of the gathered units (FSDP keeps the shard beside the
    # full copy; the ledger counts the (S-1)/S it gathers). The last block is the largest.
    assert rows["DDP"].in_step == {}
    for label, r in rows.items():
        if label == "DDP":
            continue
        assert set(r.in_step) == set(compare.MOMENTS)
        assert all(h.root == 4 * n.root_params for h in r.in_step.values()), label
        strategy = r.predicted.strategy
        s = 2 if strategy == "HYBRID_SHARD" else 4
        gathered = {"NO_SHARD": 0, "SHARD_GRAD_OP": 4 * n.num_params}.get(
            strategy, 4 * (n.largest_unit + n.root_params))
        forward = r.in_step[compare.MOMENTS[0]].params
        assert forward == r.predicted.step.params + gathered / s, label
    step_text = compare.step_table(list(rows.values()))
    assert "đủ" in step_text and "chia" not in step_text  # the root: unsharded in every row
    assert len(step_text.splitlines()) == 2 + len(rows) - 1 + 1  # head, rule, FSDP rows, note
    with pytest.raises(ValueError, match="Không có kết quả"):
        compare.collect(results, (Parallel("fsdp2", reshard_after_forward=False),))
