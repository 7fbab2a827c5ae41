"""``dpbook.torchrun``: command lines, two agents emulating two nodes, timeouts without orphans."""

import sys
import textwrap

import pytest

from dpbook import torchrun

SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    from dpbook import torchrun  # one write per line: workers run unbuffered
    torchrun.emit("rank", {"rank": int(os.environ["RANK"]), "local": int(os.environ["LOCAL_RANK"]),
                           "world": int(os.environ["WORLD_SIZE"]), "sum": int(t.item()),
                           "barrier": os.environ.get("TORCH_DIST_INIT_BARRIER")})
    dist.destroy_process_group()
""")


def test_single_node_command_is_standalone():
    cmd = torchrun.command("dpbook.scripts.ddp_script", ["--epochs", 1], nproc_per_node=2, max_restarts=3)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in cmd and "--max_restarts=3" in cmd
    assert cmd[-4:] == ["-m", "dpbook.scripts.ddp_script", "--epochs", "1"]


def test_multi_node_command_uses_c10d_rendezvous():
    cmd = torchrun.command("train.py", nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500",
                           module=False)
    assert "--rdzv_backend=c10d" in cmd and "--rdzv_endpoint=10.0.0.1:29500" in cmd
    assert "--nnodes=2" in cmd and "--standalone" not in cmd and cmd[-1] == "train.py"


@pytest.mark.parametrize("kwargs, match", [
    (dict(nproc_per_node=0), "nproc_per_node"),
    (dict(nnodes=2), "rdzv_endpoint"),
    (dict(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "node_rank"),
    (dict(max_restarts=-1), "max_restarts"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        torchrun.command("x", **kwargs)


@pytest.mark.distributed
def test_two_agents_form_one_world(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    results = torchrun.run(str(script), module=False, nproc_per_node=2, nnodes=2, timeout=120)
    records = torchrun.json_records(results, "rank")
    assert sorted((r["rank"], r["local"], r["world"], r["sum"]) for r in records) == [
        (g, g % 2, 4, 10) for g in range(4)]
    assert {r["barrier"] for r in records} == {"1"}  # no worker leaves while a peer connects
    # each agent started its own two workers
    for agent in range(2):
        assert len({r["rank"] for r in records if r["agent"] == agent}) == 2


def _alive(pids):
    """Processes still running (a zombie waiting for init to reap it counts as dead)."""
    alive = []
    for pid in pids:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.distributed
def test_timeout_kills_agents_and_workers(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(f"import os, time\nopen(os.path.join({str(tmp_path)!r}, f'pid{{os.getpid()}}'), 'w')"
                      "\ntime.sleep(300)\n")
    with pytest.raises(TimeoutError, match="chưa xong sau 15 s") :
        torchrun.run(str(script), module=False, nproc_per_node=2, timeout=15)
    pids = [int(f.name[3:]) for f in tmp_path.glob("pid*")]
    assert len(pids) == 2 and _alive(pids) == []


@pytest.mark.distributed
def test_failure_is_reported_with_output(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit('hỏng có chủ ý')\n")
    with pytest.raises(RuntimeError, match="torchrun thất bại ở node") as info:
        torchrun.run(str(script), module=False, nproc_per_node=1, timeout=60)
    assert "hỏng có chủ ý" in str(info.value)
    results = torchrun.run(str(script), module=False, nproc_per_node=1, timeout=60, check=False)
    assert results[0].returncode != 0 and not results[0].ok


def test_a_worker_always_leaves_its_group_and_aborts_it_after_a_failure(monkeypatch):
    from dpbook.torchrun import worker

    left = []
    monkeypatch.setattr(worker, "init_from_env", lambda: "cpu")
    monkeypatch.setattr(worker.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(worker, "leave_groups", lambda backend, failed: left.append((backend, failed)))
    with worker.process_group() as dev:
        assert dev == "cpu"
    with pytest.raises(ValueError):
        with worker.process_group():
            raise ValueError("hỏng")
    assert left == [("nccl", False), ("nccl", True)]


def test_every_rank_of_a_start_gets_the_same_fresh_prefix_despite_stale_keys():
    """torchrun's agent store lives as long as the job: the second start of a 3-rank group finds
    the first start's keys, and ranks 1 and 2 join late (rank 0 reads their stale nonces first).
    Every rank of each start must still get one prefix, a new one."""
    import datetime
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist
    from dpbook.torchrun import worker

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=20)

    def start(world, late=()):
        def one(rank):
            store = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)
            if rank in late:
                time.sleep(0.3)
            return worker.agree_on_start(store, rank, world, timeout)
        with ThreadPoolExecutor(world) as pool:
            return list(pool.map(one, range(world)))

    first, second = start(3), start(3, late={1, 2})
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]
    assert start(1) != [second[0]]


def test_pytorch_timeouts_unless_a_test_asks():
    import datetime

    from dpbook.torchrun import worker

    assert worker.test_timeout({}) is None and worker.test_timeout({worker.TIMEOUT_VAR: ""}) is None
    assert worker.test_timeout({worker.TIMEOUT_VAR: "20"}) == datetime.timedelta(seconds=20)
    with pytest.raises(ValueError, match=worker.TIMEOUT_VAR):
        worker.test_timeout({worker.TIMEOUT_VAR: "0"})
