"""Data parallelism changes where gradients are computed, not what they are: DDP and FSDP on
2 ranks with half batches end with the same weights as one process with the full batch."""

import pytest
import torch

from dpbook import launch, train
from dpbook.models import build_mlp
from dpbook.train import Parallel

pytestmark = pytest.mark.distributed

STEPS, BATCH = 4, 8


@pytest.fixture(scope="module")
def reference():
    # One process, global batch 2 * BATCH: float64 so that the only difference left is the
    # order of floating-point sums, far below the tolerance.
    return train.fit(0, 1, None, steps=STEPS, batch_size=2 * BATCH)


@pytest.mark.parametrize("par", [Parallel("ddp"), Parallel("fsdp2"),
                                 Parallel("fsdp1", strategy="FULL_SHARD"),
                                 Parallel("fsdp1", strategy="SHARD_GRAD_OP")],
                         ids=lambda p: p.label)
def test_two_ranks_match_one_process(reference, par):
    res = launch.spawn(train.fit, par, steps=STEPS, batch_size=BATCH, world_size=2,
                       backend="gloo", output="none")
    for r in res:
        assert r["state"].keys() == reference["state"].keys()
        for name, value in reference["state"].items():
            torch.testing.assert_close(r["state"][name], value, rtol=0, atol=1e-12)
    # The global loss is the mean of the ranks' losses (equal halves of the batch).
    for step in range(STEPS):
        mean = (res[0]["losses"][step] + res[1]["losses"][step]) / 2
        assert mean == pytest.approx(reference["losses"][step], abs=1e-12)
    # ... and training did something: every tensor moved away from its initial value.
    initial = build_mlp().double().state_dict()
    assert all((reference["state"][k] - v).abs().max() > 1e-4 for k, v in initial.items())


def test_fit_refuses_a_world_without_wrapper():
    with pytest.raises(ValueError, match="world_size=1"):
        train.fit(0, 2, None)
