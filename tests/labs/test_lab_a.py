"""Lab A (section 4.2, single-GPU script to DDP): ``dpbook.labs.lab_a`` and its checker."""

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from dpbook.labs.lab_a import SOLUTION, checker, common
from dpbook.labs.lab_a.single_gpu import epoch_order


def ddp_traces(n, world, epochs, set_epoch=True):
    """What each rank of a correct (or set_epoch-less) DDP conversion reads."""
    traces = {}
    for r in range(world):
        s = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True,
                               seed=common.SEED)
        seq = []
        for e in range(epochs):
            if set_epoch:
                s.set_epoch(e)
            seq += list(s)
        traces[r] = seq
    return traces


def test_reference_order_is_distributed_sampler_order():
    n, world, b = common.NUM_SAMPLES, 2, common.BATCH_SIZE
    traces = ddp_traces(n, world, 3)
    for e in range(3):
        order = epoch_order(n, e)
        parts = [traces[r][e * n // world:(e + 1) * n // world] for r in range(world)]
        # a global batch of the reference = the union of the ranks' local batches
        for k in range(n // b):
            local = sum((p[k * b // world:(k + 1) * b // world] for p in parts), [])
            assert sorted(local) == sorted(order[k * b:(k + 1) * b])


def test_split_and_set_epoch_checks():
    n, world, epochs = 64, 2, 3
    good = ddp_traces(n, world, epochs)
    assert checker.check_split(good, n, world, epochs).passed
    assert checker.check_set_epoch(good, epochs).passed
    stale = ddp_traces(n, world, epochs, set_epoch=False)
    assert checker.check_split(stale, n, world, epochs).passed
    item = checker.check_set_epoch(stale, epochs)
    assert not item.passed and "epoch 0 và epoch 1" in item.detail
    whole = {r: sum((epoch_order(n, e) for e in range(epochs)), []) for r in range(world)}
    item = checker.check_split(whole, n, world, epochs)
    assert not item.passed and "192 mẫu" in item.detail
    assert not checker.check_split({0: good[0]}, n, world, epochs).passed


def test_log_and_loss_checks():
    assert checker.check_log("epoch 0: a\nx\nepoch 1: b\n", 2).passed
    assert not checker.check_log("epoch 0: a\nepoch 0: a\nepoch 1: b\nepoch 1: b\n", 2).passed
    assert checker.check_loss(0.5, 0.5 + 1e-12).passed
    assert not checker.check_loss(0.5, 0.501).passed
    assert not checker.check_loss(None, 0.5).passed


def test_exit_and_log_hints():
    item = checker.check_exit(None)
    assert not item.passed and "quá thời gian" in item.detail
    assert checker.check_exit(0).passed
    assert "if rank == 0" in checker.check_log("epoch 0: a\n" * 4, 2).hint  # N bản log
    assert "rank 0 in" in checker.check_log("", 2).hint  # không có log


def test_checkpoint_check(tmp_path):
    model = common.build_model()
    torch.save({"state": model.state_dict(), "loss": 1.0}, tmp_path / "ok.pt")
    assert checker.check_checkpoint(tmp_path / "ok.pt")[0].passed
    bad = {f"module.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state": bad, "loss": 1.0}, tmp_path / "bad.pt")
    item, state, _ = checker.check_checkpoint(tmp_path / "bad.pt")
    assert not item.passed and "module." in item.detail
    # the prefix is reported once, by the checkpoint item, not again by the weights item
    assert checker.check_weights(state, model.state_dict())[0].passed
    assert not checker.check_checkpoint(tmp_path / "missing.pt")[0].passed


def test_traced_dataset_records_per_rank(tmp_path, monkeypatch):
    monkeypatch.setenv(common.TRACE_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    ds = common.make_dataset()
    for _ in DataLoader(ds, batch_size=4, sampler=[3, 1, 2, 0]):
        pass
    assert common.read_traces(tmp_path) == {1: [3, 1, 2, 0]}


def test_check_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="epochs"):
        checker.check(SOLUTION, epochs=1)
    with pytest.raises(ValueError, match="Không thấy file"):
        checker.check(tmp_path / "nope.py")


# The checker's two real torchrun runs (the solution passes with weights within TOL; the
# module-prefix conversion fails only "checkpoint") run once, in the lab's own page
# (book/ch04/p2/bai-a-ddp.ipynb, hidden assert cells), which nbval runs in `make test`.


def test_command_line_refuses_a_missing_or_broken_script(refuses_without_starting):
    refuses_without_starting("lab_a")


def _judge(traces, weights_off: bool, loss: float):
    """The items of a run that exited cleanly, logged once and saved a clean checkpoint, with
    these traces, weights (the reference's, or off by 1e-3) and final loss."""
    ref = checker.Reference(common.build_model().state_dict(), 0.38, "", [])
    state = {k: v + (1e-3 if weights_off else 0.0) for k, v in ref.state.items()}
    ckpt = checker.Item("checkpoint", "Checkpoint", True)
    items, _ = checker.judge(0, "epoch 0:\nepoch 1:\nepoch 2:\n", 3, 2, ckpt, state, loss,
                             traces, ref)
    return {i.key: i for i in items}


def test_weights_and_loss_hints_name_the_cause_the_traces_show():
    n = common.NUM_SAMPLES
    # Only set_epoch missing: the same order every epoch, so other weights and another loss.
    items = _judge(ddp_traces(n, 2, 3, set_epoch=False), True, 0.30)
    assert [k for k, i in items.items() if not i.passed] == ["set_epoch", "weights", "loss"]
    for key in ("weights", "loss"):
        assert "set_epoch(epoch)" in items[key].hint and "module" not in items[key].hint
    # No DistributedSampler: every rank reads everything; the split is named, not set_epoch.
    whole = {r: sum((epoch_order(n, e) for e in range(3)), []) for r in range(2)}
    items = _judge(whole, True, 0.27)
    assert "DistributedSampler" in items["loss"].hint and "module" not in items["loss"].hint
    # Right data, right weights, another loss: then it is how the loss was computed.
    items = _judge(ddp_traces(n, 2, 3), False, 0.30)
    assert [k for k, i in items.items() if not i.passed] == ["loss"]
    assert "evaluate(model.module, dataset)" in items["loss"].hint


# A conversion without set_epoch, run for real: test_mutants.py (the no_set_epoch mutant).
