"""The storage census (``dpbook.allocations``) against known allocations, and DDP's bucket copy
of the gradients measured in a real run against the ledger (``memory.vram_ledger``) and against
DDP's own argument (``gradient_as_bucket_view``)."""

import gc

import pytest
import torch

from dpbook import launch, measure, memory
from dpbook.allocations import CATEGORIES, Census, census_of


def test_allocations_are_counted_views_and_in_place_writes_are_not():
    with Census() as census:
        a = torch.empty(1000)  # 4000 B
        view = a[10:20]
        a.add_(1.0)
        b = a * 2  # 4000 B more
        assert census.live_bytes() == 8000 and census_of([a, view, b]) == 8000
        del b
        gc.collect()
        assert census.live_bytes() == 4000 and census.peak_bytes() == 8000
        census.reset_peak()
        assert census.peak_bytes() == 4000
        # FSDP frees and refills its gathered parameters by resizing their storage in place
        a.untyped_storage().resize_(0)
        assert census.live_bytes() == 0
        a.untyped_storage().resize_(400)
        assert census.live_bytes() == 400
    assert Census.current() is None
    assert torch.UntypedStorage.resize_ is census._resize  # the patch is gone


def test_breakdown_attributes_every_byte_once():
    model = torch.nn.Linear(10, 10)  # 110 parameters, allocated before the census
    with Census() as census:
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(4, 10)).sum().backward()
        opt.step()
        extra = torch.zeros(25)  # 100 B the categories do not know: "other"
        b = census.breakdown(model, opt)
    assert set(b) == set(CATEGORIES)
    assert (b["parameters"], b["gradients"], b["optimizer"]) == (440, 440, 880)
    assert b["buffers"] == 0 and b["other"] >= extra.numel() * 4


def _ddp_state(rank, world_size, view):
    from dpbook.data import rank_batch, synthetic_regression
    from dpbook.models import build_mlp, num_params
    from dpbook.train import apply_ddp, train_step

    with Census() as census:
        model = build_mlp()
        ddp = apply_ddp(model, gradient_as_bucket_view=view)
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        ds = synthetic_regression(8 * world_size, model.blocks[0].linear.in_features,
                                  model.head.out_features)
        x, y = rank_batch(ds.tensors, rank, 8, torch.device("cpu"))
        for _ in range(2):  # Adam's state; DDP rebuilds its buckets after the first step
            train_step(ddp, opt, x, y)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        measure.settle_collectives()
        return num_params(model), measure.state_bytes(ddp, opt)


@pytest.mark.distributed
def test_ddp_holds_a_bucket_copy_of_the_gradients_unless_they_are_views():
    (p, copy), _ = launch.spawn(_ddp_state, False, world_size=2, backend="gloo", output="none")
    (_, view), _ = launch.spawn(_ddp_state, True, world_size=2, backend="gloo", output="none")
    assert copy.method == view.method == "census"
    # the Reducer's flat bucket.gradients: one more copy of the fp32 gradients, 4P
    assert copy.buffers == copy.grads == 4 * p
    assert copy.as_ledger() == memory.vram_ledger(p, 2, "DDP")  # 20P
    # gradient_as_bucket_view=True: the gradients are those buckets, no copy left
    assert view.buffers == 0 and view.grads == 4 * p
    assert view.as_ledger() == memory.vram_ledger(p, 2, "DDP", bucket_view=True)  # 16P
    assert copy.as_ledger().total - view.as_ledger().total == 4 * p
