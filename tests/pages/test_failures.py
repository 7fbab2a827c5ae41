"""Section 4.2.5 (common failures): ``dpbook.pages.failures``."""

import pytest
import torch
import torch.distributed as dist

from dpbook.pages import failures
from dpbook import launch, torchrun


def test_distributed_sampler_evens_out_the_ranks():
    # 21 samples on 2 ranks: padded to 11 + 11, or trimmed to 10 + 10
    assert failures.per_rank_counts(21, 2, 4) == [(11, 3), (11, 3)]
    assert failures.per_rank_counts(21, 2, 4, drop_last=True) == [(10, 3), (10, 3)]
    with pytest.raises(ValueError, match="batch_size"):
        failures.per_rank_counts(21, 2, 0)


def test_collective_calls_and_matching_lines():
    assert failures.collective_calls((2, 1)) == [["AllReduce", "AllReduce", "barrier"],
                                                 ["AllReduce", "barrier"]]
    text = "a\nValueError: x\nb\nValueError: x\nKeyError: y"
    assert failures.matching_lines(text, "Error") == ["ValueError: x", "KeyError: y"]


def test_busy_port_refuses_a_second_listener_and_port_zero_works():
    with failures.busy_port() as port:
        with pytest.raises(dist.DistNetworkError, match="EADDRINUSE"):
            failures.init_on_port(port, timeout=5)
    assert failures.init_on_port(torchrun.free_port()) == "gloo"
    assert not dist.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_gpu_checkpoint_needs_map_location_on_cpu(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    failures.save_as_if_on_gpu({"w": torch.arange(3.0)}, path)
    assert failures.storage_locations(path) == ["cuda:0"]
    with pytest.raises(RuntimeError, match="map_location"):
        torch.load(path)
    assert torch.equal(torch.load(path, map_location="cpu")["w"], torch.arange(3.0))


@pytest.mark.distributed
def test_scenarios_unused_parameters_and_batchnorm():
    runs = [("lỗi", failures.unused_parameters, {}),
            ("sửa", failures.unused_parameters, {"find_unused_parameters": True}),
            ("tĩnh", failures.unused_parameters,
             {"find_unused_parameters": True, "static_graph": True}),
            ("bn", failures.batchnorm_drift, {"steps": 5})]
    results = launch.spawn(failures.scenarios, runs, world_size=2, backend="gloo",
                           timeout=120, output="none")
    for r in results:
        assert "Expected to have finished reduction" in r["lỗi"]["error"][1]
        assert len(r["sửa"]["result"]["losses"]) == 3 and not r["sửa"]["result"]["aux_grad"]
        # find_unused_parameters=True alone never rebuilds the buckets; with static_graph: step 3
        assert r["sửa"]["result"]["rebuilt_at"] is None and r["tĩnh"]["result"]["rebuilt_at"] == 3
    a, b = (r["sửa"]["result"]["state"] for r in results)
    assert all(torch.equal(a[k], b[k]) for k in a)  # replicas still identical
    bn = [r["bn"]["result"] for r in results]
    assert torch.equal(bn[0]["before"], bn[1]["before"])  # broadcast from rank 0
    m = bn[0]["momentum"]
    for x in bn:  # PyTorch's update rule, on each rank's own batch
        assert torch.allclose(x["final"], (1 - m) * x["before"] + m * x["batch_mean"], atol=1e-6)
    assert not torch.allclose(bn[0]["final"], bn[1]["final"])


@pytest.mark.distributed
def test_crash_names_the_rank_that_raised():
    with pytest.raises(launch.RankError) as info:
        launch.spawn(failures.crash, world_size=2, backend="gloo", timeout=120, output="none")
    assert info.value.rank == 1
    assert "mat1 and mat2 shapes cannot be multiplied" in str(info.value)
