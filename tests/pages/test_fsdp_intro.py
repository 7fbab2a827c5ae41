"""Section 4.1.6 (FSDP): ``dpbook.pages.fsdp_intro``: a parameter after ``fully_shard`` and a
Distributed Checkpoint round trip on 2 ranks."""

import pytest
import torch

from dpbook.pages import fsdp_intro
from dpbook import launch


def test_sharded_parameter_of_a_plain_tensor():
    info = fsdp_intro.sharded_parameter(torch.nn.Parameter(torch.zeros(6, 3)))
    assert info == {"is_dtensor": False, "full_shape": (6, 3), "local_shape": (6, 3),
                    "placements": ()}


def test_dcp_round_trip_rejects_bad_steps():
    with pytest.raises(ValueError, match="steps"):
        fsdp_intro.dcp_round_trip(0, 1, "/nonexistent", steps=0)


@pytest.mark.distributed
def test_dcp_round_trip_restores_the_training_state(tmp_path):
    results = launch.spawn(fsdp_intro.dcp_round_trip, str(tmp_path), world_size=2,
                           backend="gloo", timeout=180, output="none")
    for r in results:
        # fully_shard: a DTensor split by rows, half of the rows on each rank
        assert r["shard"]["is_dtensor"] and r["shard"]["placements"] == ("S(0)",)
        assert r["shard"]["local_shape"][0] * 2 == r["shard"]["full_shape"][0]
        # one file per rank plus the metadata
        assert r["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        # the fresh model started elsewhere and came back exactly to the saved weights
        assert not any(torch.equal(r["saved"][k], r["before"][k]) for k in r["saved"])
        assert all(torch.equal(r["saved"][k], r["loaded"][k]) for k in r["saved"])
        assert r["adam_steps"] == (2, 2)
        # Adam's moments came back: the shards are equal, and the loss after one more Adam step
        # (which reads them) is equal; with the weights alone and a fresh Adam it is not
        assert r["moments_equal"]
        assert r["next_loss"][0] == r["next_loss"][1]
        assert r["later_loss"][0] == r["later_loss"][1] != r["reset_loss"]


def test_wrap_tiny_transformer_rejects_unknown_wrappings():
    from dpbook.models.transformer import build_tiny_transformer

    with pytest.raises(ValueError, match="wrapping"):
        fsdp_intro.wrap_tiny_transformer(build_tiny_transformer(), "embedding-only")


@pytest.mark.distributed
def test_root_keeps_embedding_and_head_unsharded_for_the_whole_step():
    results = launch.spawn(fsdp_intro.root_unsharded, world_size=2, backend="gloo", timeout=180,
                           output="none")
    for r in results:
        for moment in fsdp_intro.MOMENTS:
            assert r["root"][moment] == {"embed": True, "head": True}
            assert r["separate"][moment] == {"embed": False, "head": False}
        # the root with reshard_after_forward=True: sharded only between forward and backward,
        # gathered again as soon as backward starts (so the step's peak does not drop)
        between = fsdp_intro.MOMENTS[1]
        assert r["root_true"][between] == {"embed": False, "head": False}
        assert all(r["root_true"][m] == {"embed": True, "head": True}
                   for m in fsdp_intro.MOMENTS if m != between)
        assert r["params"]["embed"] == 64 * 32 and r["params"]["head"] == 32 * 64 + 64


@pytest.mark.distributed
def test_traffic_tour_counts_gloos_bytes_on_the_sockets():
    from dpbook import costs, measure

    results = launch.spawn(fsdp_intro.traffic_tour, world_size=2, backend="gloo", timeout=180,
                           output="none")
    for r in results:
        ddp, full = r["DDP"], r["FSDP2 reshard_after_forward=True"]
        psi = 4 * ddp["num_params"]
        # the ring formula on the recorded collectives: FSDP 1.5 x DDP
        assert full["volume"] == costs.fsdp_step_bytes(psi, 2, "FULL_SHARD")
        for m in r.values():  # the socket count against gloo's algorithms, to the byte
            assert m["wire"].sent == measure.gloo_step_wire(m["records"], m["rank"]).sent
        # gloo's data alone: AllGather twice half the tensor, ReduceScatter = AllReduce (all of it)
        assert measure.gloo_step_wire(full["records"], 0, header=0).sent == 2 * psi
        assert full["wire"].sent > 2 * ddp["wire"].sent
