"""Section 4.2.4 (torchrun, several nodes): ``dpbook.scripts.torchrun_env``, ``dpbook.scripts.hsdp_script``,
``dpbook.pages.multi_node`` and ``torchrun.json_records``."""

import pytest
import torch

from dpbook.scripts import hsdp_script, torchrun_env
from dpbook.torchrun import worker
from dpbook.pages import multi_node
from dpbook import torchrun

ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
       "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
       "TORCHELASTIC_RUN_ID": "job7"}


def _report(rank, local, group, agent, local_world=2, world=4):
    return {"RANK": rank, "LOCAL_RANK": local, "GROUP_RANK": group, "agent": agent,
            "LOCAL_WORLD_SIZE": local_world, "WORLD_SIZE": world}


def test_read_env_parses_and_refuses_plain_python():
    env = worker.read_env(ENV)
    assert env["RANK"] == 3 and env["MASTER_PORT"] == 29500 and env["MASTER_ADDR"] == "node0"
    assert env["TORCHELASTIC_RUN_ID"] == "job7" and "ROLE_RANK" not in env
    with pytest.raises(RuntimeError, match="torchrun"):
        worker.read_env({"RANK": "0"})


@pytest.mark.parametrize("extra, gpus, expected", [
    ({}, 0, ("gloo", None)),
    ({}, 2, ("nccl", 1)),  # a real node: cuda:LOCAL_RANK, needs LOCAL_WORLD_SIZE GPUs
    ({"DPBOOK_SAME_HOST": "1"}, 2, ("gloo", None)),  # emulated nodes need WORLD_SIZE GPUs
    ({"DPBOOK_SAME_HOST": "1"}, 4, ("nccl", 3)),  # ... and each worker owns cuda:RANK
])
def test_choose_backend(extra, gpus, expected):
    assert worker.choose_backend({**ENV, **extra}, gpus) == expected


@pytest.mark.parametrize("host_ranks, gpus, expected", [
    ([2, 3], 2, ("nccl", 1)),  # this agent alone on its machine: cuda:LOCAL_RANK
    ([0, 1, 2, 3], 2, ("gloo", None)),  # two agents on one 2-GPU host: would collide, so gloo
    ([0, 1, 2, 3], 4, ("nccl", 3)),  # ... on a 4-GPU host each takes its own GPU
    ([1, 3], 2, ("nccl", 1)),  # two hosts, ranks interleaved: one agent per host
])
def test_choose_backend_with_the_ranks_found_on_this_host(host_ranks, gpus, expected):
    assert worker.choose_backend(ENV, gpus, host_ranks) == expected  # RANK 3, LOCAL_RANK 1


def test_a_forced_backend_is_obeyed_or_refused():
    assert worker.choose_backend({**ENV, "DPBOOK_BACKEND": "gloo"}, 8) == ("gloo", None)
    assert worker.choose_backend({**ENV, "DPBOOK_BACKEND": "nccl"}, 2) == ("nccl", 1)
    with pytest.raises(ValueError, match="DPBOOK_BACKEND=nccl cần một GPU cho mỗi rank .*cần 2 GPU"):
        worker.choose_backend({**ENV, "DPBOOK_BACKEND": "nccl"}, 1)
    with pytest.raises(ValueError, match="chỉ nhận gloo hoặc nccl"):
        worker.choose_backend({**ENV, "DPBOOK_BACKEND": "mpi"}, 2)


def test_forcing_gloo_hides_the_gpus_from_a_script_that_chooses_itself():
    assert torchrun.BACKEND_ENV["gloo"] == {"DPBOOK_BACKEND": "gloo", "CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(ValueError, match="backend"):
        torchrun.run("dpbook.scripts.torchrun_env", backend="cuda")


def test_workers_find_the_ranks_on_their_machine():
    import threading

    store = torch.distributed.HashStore()
    hosts = {0: "máy-A", 1: "máy-B", 2: "máy-A", 3: "máy-B"}
    found = {}

    def publish(rank):
        found[rank] = worker.ranks_on_this_host(store, rank, 4, me=hosts[rank])

    threads = [threading.Thread(target=publish, args=(r,)) for r in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert found == {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}
    assert worker.host_id() == worker.host_id() != ""


def test_layout_problems_sees_wrong_arithmetic_and_agents():
    good = [_report(0, 0, 0, 0), _report(1, 1, 0, 0), _report(2, 0, 1, 1), _report(3, 1, 1, 1)]
    assert torchrun_env.layout_problems(good) == []
    swapped = [dict(r) for r in good]
    swapped[1]["RANK"], swapped[2]["RANK"] = 2, 1
    assert any("GROUP_RANK*LOCAL_WORLD_SIZE" in p for p in torchrun_env.layout_problems(swapped))
    mixed = good[:1] + [_report(1, 1, 1, 0)] + good[2:]
    assert any("cùng một agent" in p for p in torchrun_env.layout_problems(mixed))
    assert any("WORLD_SIZE" in p for p in torchrun_env.layout_problems(good[:3]))


def test_json_records_reads_tagged_lines_with_their_agent():
    results = [torchrun.AgentResult(0, (), 0, 'warning\nTAG {"a": 1}\nTAGX {"a": 9}\n'),
               torchrun.AgentResult(1, (), 0, 'TAG {"a": 2}\n')]
    assert torchrun.json_records(results, "TAG") == [{"a": 1, "agent": 0}, {"a": 2, "agent": 1}]


def test_hsdp_script_arguments_are_checked(tmp_path):
    assert hsdp_script.parallel("fsdp1", 2).strategy == "HYBRID_SHARD"
    assert hsdp_script.parallel("fsdp2", 2).shard_size == 2
    with pytest.raises(ValueError, match="method"):
        hsdp_script.parallel("ddp", 2)
    with pytest.raises(SystemExit):
        hsdp_script.parse_args([str(tmp_path), "--steps", "0"])
    assert hsdp_script.parse_args([str(tmp_path / "missing")]).out_dir.endswith("missing")  # D20
    args = hsdp_script.parse_args([str(tmp_path), "--methods", "fsdp1"])
    assert args.methods == ["fsdp1"] and args.steps == 3


def test_traffic_by_group_sums_per_group_and_collective():
    records = [["all_gather", "forward", 8, 4.0, [0, 1]], ["all_reduce", "backward", 4, 4.0, [0, 2]],
               ["all_gather", "backward", 8, 4.0, [0, 1]], ["reduce_scatter", "backward", 8, 4.0, [0, 1]]]
    assert hsdp_script.traffic_by_group(records) == {
        (0, 1): {"all_gather": 8.0, "reduce_scatter": 4.0}, (0, 2): {"all_reduce": 4.0}}


def test_model_sizes_and_figure():
    assert hsdp_script.model_sizes() == {"num_params": 2788, "root_params": 132}
    pos = multi_node.worker_positions([(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)])
    assert pos[0][1] == pos[1][1] > pos[2][1] == pos[3][1]  # node 0 is the top row
    assert pos[0][0] == pos[2][0] < pos[1][0]  # same local rank, same column
    fig = multi_node.node_figure([(0, 0, 0), (1, 1, 0)], [[0, 1]], None, "x")
    assert fig.axes[0].get_title(loc="left") == "x"


def test_the_two_node_command_is_the_same_on_every_node():
    cmd = multi_node.two_node_command("10.0.0.1:29500")
    assert cmd.startswith("torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d ")
    assert "--node_rank" not in cmd and "--rdzv_endpoint=10.0.0.1:29500" in cmd
