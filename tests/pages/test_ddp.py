"""Section 4.1.3 (DDP): the sampler, the construction Broadcast, the gradient AllReduce, the
``module.`` prefix and rank-0 checkpointing, in ``dpbook.pages.ddp``; and the runs behind the page's errata."""

import matplotlib
import pytest
import torch

from dpbook import data, launch, memory, shapes
from dpbook.pages import ddp
from dpbook.measure import CommRecord

matplotlib.use("Agg")


def _partition_ok(parts, dataset_size):
    return (sum(len(set(p)) for p in parts) == dataset_size
            and set().union(*map(set, parts)) == set(range(dataset_size)))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_sampler_partitions_every_epoch(world_size):
    n = 12
    runs = [data.sampler_epochs(n, world_size, r, epochs=3) for r in range(world_size)]
    for e in range(3):
        assert _partition_ok([run[e] for run in runs], n)


def test_without_set_epoch_every_epoch_repeats():
    for r in range(2):
        without = data.sampler_epochs(16, 2, r, epochs=3, call_set_epoch=False)
        with_ = data.sampler_epochs(16, 2, r, epochs=3, call_set_epoch=True)
        assert without[0] == without[1] == without[2]
        assert len({tuple(o) for o in with_}) == 3
        assert with_[0] == without[0]


def test_sampler_pads_when_not_divisible():
    a, b = (data.sampler_epochs(15, 2, r, epochs=1)[0] for r in range(2))
    assert len(a) == len(b) == 8 and len(set(a) & set(b)) == 1
    assert set(a) | set(b) == set(range(15))


@pytest.mark.parametrize("bad", [dict(rank=2), dict(rank=-1), dict(epochs=0),
                                 dict(dataset_size=0), dict(world_size=0)])
def test_sampler_epochs_rejects_bad_arguments(bad):
    kwargs = dict(dataset_size=8, world_size=2, rank=0, epochs=1) | bad
    with pytest.raises(ValueError):
        data.sampler_epochs(**kwargs)


@pytest.mark.parametrize("world_size", [1, 8, 64])
def test_preset_states_are_the_ledgers_ddp_state(world_size):
    states = ddp.preset_states(world_size=world_size)
    assert list(states) == list(ddp.STATE_PRESETS)
    for key, (preset, state) in states.items():
        assert preset == shapes.presets()[key]
        assert state == memory.vram_ledger(preset.num_params, 1, "DDP").total
        assert state == 20 * preset.num_params  # 4 + 4 + 8 byte and the bucket copy, for any N


def test_demo_model_depends_on_seed_and_has_buffers():
    m0, m1 = ddp.demo_model(0), ddp.demo_model(1)
    assert not torch.equal(m0.mlp.head.weight, m1.mlp.head.weight)
    assert not torch.equal(m0.norm.running_mean, m1.norm.running_mean)
    assert torch.equal(ddp.demo_model(0).norm.running_mean, m0.norm.running_mean)
    assert ddp.bytes_by_dtype(m0.buffers()) == {"torch.float32": 2 * 16 * 4,
                                                      "torch.int64": 8}


def test_owner_grid_and_figures():
    runs = [data.sampler_epochs(8, 2, r, epochs=2) for r in range(2)]
    grid = ddp.owner_grid(runs, 8)
    assert all(len(cell) == 1 for row in grid for cell in row)
    ddp.sampler_figure(runs, runs, 8)
    rec = CommRecord("broadcast_", "broadcast", 100, 2, "forward")
    rows = ddp.timeline_rows([rec], [[rec], [rec, rec]])
    assert [r.phase for r in rows] == ["khởi tạo DDP", "bước 0", "bước 1", "bước 1"]
    ddp.collectives_figure(rows)
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.mark.distributed
def test_sampler_orders_in_processes():
    orders = launch.spawn(data.sampler_orders, world_size=2, backend="gloo",
                          output="none", dataset_size=16, epochs=3)
    for o in orders:
        assert o["with_set_epoch"] == data.sampler_epochs(16, 2, o["rank"], 3, True)
        assert o["without_set_epoch"] == data.sampler_epochs(16, 2, o["rank"], 3, False)


@pytest.mark.distributed
def test_ddp_lifecycle(tmp_path):
    path = tmp_path / "m.pt"
    life = launch.spawn(ddp.ddp_lifecycle, world_size=2, backend="gloo", output="none",
                        steps=3, save_path=str(path))
    r0 = life[0]
    # different starts, rank 0's weights and buffers right after wrapping
    assert not torch.equal(life[1]["before"]["mlp.head.weight"], r0["before"]["mlp.head.weight"])
    for r in life:
        assert all(torch.equal(r["after"][k], r0["before"][k]) for k in r0["before"])
        sizes = [x.nbytes for x in r["construction"] if x.collective == "broadcast"]
        for dt in set(r["param_bytes"]) | set(r["buffer_bytes"]):
            assert r["param_bytes"].get(dt, 0) + r["buffer_bytes"].get(dt, 0) in sizes
        assert "all_reduce" not in {x.collective for x in r["construction"]}
        # every step: gradients all-reduced exactly once, in backward
        grad_bytes = sum(r["param_bytes"].values())
        for recs in r["steps"]:
            ar = [x for x in recs if x.collective == "all_reduce"]
            assert sum(x.nbytes for x in ar) == grad_bytes
            assert all(x.phase == "backward" for x in ar)
        assert r["ddp_keys"] == ["module." + k for k in r["module_keys"]]
    # rank 0 saved the unwrapped model; parameters agree across ranks at the end
    saved = torch.load(path)
    assert saved.keys() == r0["final"].keys()
    assert all(torch.equal(saved[k], r0["final"][k]) for k in saved)
    assert torch.equal(life[1]["final"]["mlp.head.weight"], r0["final"]["mlp.head.weight"])
    ddp.demo_model(0).load_state_dict(saved)


@pytest.mark.distributed
def test_buffers_are_broadcast_only_after_a_synchronising_forward():
    counts = launch.spawn(ddp.buffer_broadcasts, world_size=2, backend="gloo", output="none")
    for c in counts:  # float32 statistics and the int64 counter: one Broadcast per dtype
        assert c == {"train": 2, "eval_no_grad": 2, "train_after_eval": 0, "no_sync": 2,
                     "sync_after_no_sync": 0}


@pytest.mark.distributed
def test_a_rank_holds_the_bucket_copy_of_the_gradients_unless_they_are_views():
    runs = launch.spawn(ddp.bucket_storage, world_size=2, backend="gloo", output="none")
    for r in runs:
        p = r[False]["num_params"]
        assert r[False]["held"] == 20 * p and not r[False]["grads_in_buckets"]
        assert r[True]["held"] == 16 * p and r[True]["grads_in_buckets"]
        assert r[False]["buckets"] == r[True]["buckets"] == 4 * p


@pytest.mark.distributed
@pytest.mark.parametrize("initial", [True, False])
def test_join_lets_a_rank_run_out_of_data(initial):
    runs = launch.spawn(ddp.uneven_join, world_size=2, backend="gloo", output="none",
                        divide_by_initial_world_size=initial)
    assert [len(r["steps"]) for r in runs] == [1, 2]
    (both0, _), (both1, _) = runs[0]["steps"][0], runs[1]["steps"][0]
    assert torch.equal(both0, both1)  # the step both ranks ran: the same averaged gradient
    grad, local = runs[1]["steps"][1]  # rank 1 alone: rank 0 shadows with zeros
    assert torch.allclose(grad, local / 2 if initial else local, rtol=0, atol=1e-15)
