"""Section 4.2.6 (fault tolerance): ``dpbook.scripts.resume``: arguments, the step-indexed data order,
complete checkpoints only and the cost model (the real crash and restart runs in 4.2.6 itself)."""

import math

import pytest
import torch
from dpbook import launch
from dpbook.scripts import resume


def cfg(**kw):
    return resume.ResumeConfig(ckpt_dir="/nonexistent", out="/nonexistent/o.pt", **kw)


@pytest.mark.parametrize("kw, match", [
    ({"kill_rank": 1}, "cùng có"),
    ({"kill_step": 3}, "cùng có"),
    ({"kill_rank": 1, "kill_step": 12}, "kill_step"),
    ({"kill_rank": 1, "kill_step": 0}, "kill_step"),
    ({"kill_rank": -1, "kill_step": 3}, "kill_rank"),
    ({"ckpt_every": 13}, "ckpt_every"),
    ({"num_samples": 60}, "num_samples"),
    ({"steps": 0}, "steps"),
])
def test_bad_configs_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


def test_command_line_reports_errors_in_vietnamese(capsys):
    with pytest.raises(SystemExit) as info:
        resume.parse_args(["--ckpt-dir", "d", "--out", "o", "--kill-rank", "1",
                           "--kill-step", "12"])
    assert info.value.code == 2
    assert "kill_step phải là số nguyên trong [1, 11]" in capsys.readouterr().err
    c = resume.parse_args(["--ckpt-dir", "d", "--out", "o", "--steps", "6", "--ckpt-every", "3"])
    assert (c.steps, c.ckpt_every, c.kill_rank, c.kill_step) == (6, 3, None, None)


def test_batches_are_a_pure_function_of_the_step():
    c = cfg()  # 64 samples, 16 per step: 4 steps per epoch
    epoch1 = torch.cat([resume.batch_indices(s, c) for s in range(1, 5)])
    assert sorted(epoch1.tolist()) == list(range(64))  # one epoch sees every sample once
    epoch2 = torch.cat([resume.batch_indices(s, c) for s in range(5, 9)])
    assert not torch.equal(epoch1, epoch2)  # a new shuffle each epoch
    assert torch.equal(resume.batch_indices(7, c), resume.batch_indices(7, c))


def test_only_complete_checkpoints_count(tmp_path):
    assert resume.latest_checkpoint(str(tmp_path)) == 0
    for step in (4, 8, 12):
        (tmp_path / f"step_{step}").mkdir()
    (tmp_path / "step_4" / resume.MARKER).write_text("{}")
    (tmp_path / "step_8" / resume.MARKER).write_text("{}")
    assert resume.latest_checkpoint(str(tmp_path)) == 8  # step_12 has no marker: cut short


def test_waste_fraction_and_young_interval():
    assert resume.waste_fraction(300, 60, 14400) == pytest.approx(0.2 + 300 / 2 / 14400)
    assert resume.waste_fraction(100, 0, 1000, restart_s=50) == pytest.approx(0.1)
    best = resume.young_interval(60, 14400)
    assert best == pytest.approx(math.sqrt(2 * 60 * 14400))
    w = resume.waste_fraction(best, 60, 14400)
    assert w < resume.waste_fraction(0.8 * best, 60, 14400)
    assert w < resume.waste_fraction(1.25 * best, 60, 14400)
    with pytest.raises(ValueError, match="interval_s"):
        resume.waste_fraction(0, 60, 14400)


def test_waste_fraction_counts_a_checkpoint_only_once_it_is_durable():
    """Asynchronous save: blocked ``save_s``, durable ``durable_after_s`` later; a failure in
    between falls back one checkpoint, so each failure loses ``durable_after_s`` more."""
    base = resume.waste_fraction(759, 10, 28800)
    assert resume.waste_fraction(759, 10, 28800, durable_after_s=110) == pytest.approx(
        base + 110 / 28800)
    assert resume.waste_fraction(100, 0, 1000, restart_s=50, durable_after_s=100) == \
        pytest.approx(0.2)
    # the optimum does not move: the extra term is a constant
    best = resume.young_interval(10, 28800)
    w = resume.waste_fraction(best, 10, 28800, durable_after_s=110)
    assert w < resume.waste_fraction(0.8 * best, 10, 28800, durable_after_s=110)
    assert w < resume.waste_fraction(1.25 * best, 10, 28800, durable_after_s=110)
    # the discrete picture: failures uniform in time, checkpoints every T, durable D later
    T, D = 100.0, 30.0
    lost = []
    for i in range(20_000):
        t = 1000 + (i + 0.5) * 10 * T / 20_000  # ten intervals, evenly
        durable = max(k * T for k in range(int(t // T) + 1) if k * T + D <= t)
        lost.append(t - durable)
    assert sum(lost) / len(lost) == pytest.approx(T / 2 + D, rel=1e-3)
    with pytest.raises(ValueError, match="durable_after_s"):
        resume.waste_fraction(100, 10, 1000, durable_after_s=101)
    with pytest.raises(ValueError, match="durable_after_s"):
        resume.waste_fraction(100, 10, 1000, durable_after_s=-1)


def test_torchrun_events_shortens_agent_lines():
    log = ("I1129 18:16:07.128000 4688 .venv/lib/python3.11/site-packages/torch/distributed/"
           "elastic/agent/server/api.py:942] [default] Worker group FAILED. 2/2 attempts left\n"
           "something else\n")
    assert resume.torchrun_events(log, ["Worker group"]) == [
        "I api.py:942] [default] Worker group FAILED. 2/2 attempts left"]


def test_run_refuses_a_crash_and_a_call_outside_a_group():
    with pytest.raises(ValueError, match="torchrun"):
        resume.run(0, 1, cfg(kill_rank=1, kill_step=3))
    with pytest.raises(ValueError, match="ResumeConfig"):
        resume.run(0, 1)
    with pytest.raises(ValueError, match="process group"):
        resume.run(0, 1, cfg())


def test_a_job_stopped_after_step_6_and_the_next_one_equal_one_uninterrupted_job(tmp_path):
    """Section 4.2.6, exercise 5: the second job starts after the last complete checkpoint (4),
    recomputes steps 5 and 6, and ends bit for bit where one 12-step job ends."""
    def job(name, steps):
        return resume.ResumeConfig(ckpt_dir=str(tmp_path / name), out="", steps=steps,
                                   ckpt_every=4)
    ranks = launch.spawn(resume.run, job("one", 12), job("two", 6), job("two", 12),
                         world_size=2, backend="gloo", timeout=120, output="none")
    for r, (one, first, second) in enumerate(ranks):
        assert (one["start"], first["start"], second["start"]) == (0, 0, 4)
        assert all(torch.equal(second["state"][k], one["state"][k]) for k in one["state"])
        assert (second["summary"] is None) == (r != 0)
    attempts = ranks[0][2]["summary"]["attempts"]
    assert [(a["from_step"], a["steps_run"], a["last_step"]) for a in attempts] == [
        (0, 6, 6), (4, 8, 12)]
    assert ranks[0][2]["summary"]["checkpoints"] == [4, 8, 12]
    assert resume.latest_checkpoint(str(tmp_path / "two")) == 12


def test_summarize_starts_an_attempt_at_each_start_event():
    events = [{"job": "", "attempt": 0, "time": 0.0, "event": "start", "from_step": 0,
               "world_size": 2},
              {"job": "", "attempt": 0, "time": 1.0, "event": "step", "step": 1, "seconds": 0.1},
              {"job": "", "attempt": 0, "time": 3.0, "event": "start", "from_step": 0,
               "world_size": 1}]
    first, second = resume.summarize(events)["attempts"]
    assert (first["steps_run"], first["last_step"], first["downtime_s"]) == (1, 1, None)
    assert (second["world_size"], second["steps_run"], second["downtime_s"]) == (1, 0, 2.0)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The 12 steps of the two-node tests on 2 ranks without a fault (one launch for both)."""
    ref = resume.ResumeConfig(ckpt_dir=str(tmp_path_factory.mktemp("ref")), out="", steps=12,
                              ckpt_every=4)
    return launch.spawn(resume.run, ref, world_size=2, backend="gloo", timeout=60,
                        output="none")[0][0]


def _two_node_run(tmp_path, name, during=None, max_restarts=1):
    """``dpbook.scripts.resume`` under two torchrun agents (two emulated nodes, one worker
    each, c10d rendezvous): 12 steps, a checkpoint every 4."""
    from dpbook import torchrun

    ckpt, out = tmp_path / name, tmp_path / f"{name}.pt"
    results = torchrun.run(
        "dpbook.scripts.resume", ["--ckpt-dir", ckpt, "--out", out, "--steps", 12,
                                  "--ckpt-every", 4],
        nproc_per_node=1, nnodes=2, max_restarts=max_restarts, timeout=95, check=False,
        backend="gloo", during=during,
        # test only: the workers wait after the first checkpoint (resume.HOLD_VAR), and the
        # process group and store time out after 20 s instead of PyTorch's 30 min
        env={resume.HOLD_VAR: 60 if during else "", "DPBOOK_TEST_PG_TIMEOUT_S": 20})
    return ckpt, out, results


def _crash(tmp_path):
    """The SIGSTOP/SIGKILL run of the first two-node test, for ``two_node_runs``.

    A rank blocked in a collective is alive but not frozen: when its agent stops the group for
    the restart it dies of the SIGTERM at once. A SIGSTOPped process would only take it after
    torchrun's 30 s grace and a SIGKILL (``LocalElasticAgent._stop_workers`` calls ``_shutdown()``
    with its default ``timeout=30``, whatever ``--shutdown-timeout`` says). So rank 0 stays stopped,
    alive and healthy to its agent, until that SIGTERM is pending in ``/proc/PID/status``; then a
    SIGCONT lets it take the signal, as the blocked rank would."""
    import os
    import signal

    done, released = [], []

    def sigterm_pending(pid: int) -> bool:
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            return False
        masks = (int(line.split()[1], 16) for line in status.splitlines()
                 if line.startswith(("SigPnd:", "ShdPnd:")))
        return any(m & (1 << (signal.SIGTERM - 1)) for m in masks)

    def fault(procs):
        if done:
            if not released and sigterm_pending(done[0][0]):
                os.kill(done[0][0], signal.SIGCONT)
                released.append(True)
            return
        ckpt = tmp_path / "crash"
        pids = [ckpt / "pid.0", ckpt / "pid.1"]
        if not all(p.exists() for p in pids):
            return
        rank0, rank1 = (int(p.read_text()) for p in pids)
        os.kill(rank0, signal.SIGSTOP)
        os.kill(rank1, signal.SIGKILL)
        done.append((rank0, rank1))

    ckpt, out, results = _two_node_run(tmp_path, "crash", during=fault)
    return bool(done), bool(released), results, out


@pytest.fixture(scope="module")
def two_node_runs(tmp_path_factory):
    """Both two-node scenarios at once, each in its own thread: they spend much of their time
    waiting on torchrun (a rendezvous's last call, a dead node's missed heartbeats), so together
    they take about as long as the longer one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        crash = pool.submit(_crash, tmp_path_factory.mktemp("crash"))
        elastic = pool.submit(_elastic, tmp_path_factory.mktemp("elastic"))
        return {"crash": crash.result(), "elastic": elastic.result()}


@pytest.mark.distributed
def test_two_nodes_survive_a_killed_worker_while_the_other_is_blocked(two_node_runs,
                                                                       uninterrupted):
    """Issue 26: on a 2-node job, after the first checkpoint rank 0's worker is blocked
    (SIGSTOP: alive, so healthy to its agent, as a rank waiting in an NCCL collective) and rank
    1's worker is killed. Agent 1 restarts after a failure (its TORCHELASTIC_RESTART_COUNT
    becomes 1), agent 0 after a membership change (its count stays 0); the new workers must
    still form one group, resume from the checkpoint rank 0 chose, and end bit for bit where an
    uninterrupted run ends."""
    injected, released, results, out = two_node_runs["crash"]
    detail = "\n".join(f"--- agent {r.node_rank} (mã thoát {r.returncode}) ---\n{r.output[-3000:]}"
                       for r in results)
    # the fault was injected, and rank 0 was still stopped when its agent told it to stop
    assert injected and released, detail
    assert [r.returncode for r in results] == [0, 0], detail
    state, summary = resume.read_result(str(out))
    # rank 0 numbered the starts of the group (0, 1), whatever each agent counted
    assert [(a["attempt"], a["from_step"]) for a in summary["attempts"]] == [(0, 0), (1, 4)], \
        summary["attempts"]
    expected = uninterrupted
    assert state.keys() == expected["state"].keys()
    assert all(torch.equal(state[k], expected["state"][k]) for k in state)


def _elastic(tmp_path):
    """The run of the elastic test (``--nnodes=1:2``, a whole node lost), for ``two_node_runs``."""
    import os
    import signal
    import sys

    from dpbook import torchrun

    ckpt, out = tmp_path / "elastic", tmp_path / "elastic.pt"
    port = torchrun.free_port()

    def agent(is_host: int, last_call_s: int) -> list[str]:
        # test only: agent 0 hosts the rendezvous store (the one killed must not); a round with
        # fewer than 2 nodes has a short last call, and a node is dead after 3 missed 2 s
        # heartbeats instead of 3 missed 5 s ones (dynamic_rendezvous.create_handler's defaults,
        # which kept the survivor waiting 15 s for the dead node); 2 s, not 1, so that a live
        # agent slowed down by a loaded machine is not taken for dead
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2",
                "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=elastic", "--max_restarts=1",
                f"--rdzv_conf=is_host={is_host},last_call_timeout={last_call_s},"
                "keep_alive_interval=2,keep_alive_max_attempt=3",
                "-m", "dpbook.scripts.resume", "--ckpt-dir", str(ckpt), "--out", str(out),
                "--steps", "12", "--ckpt-every", "4"]

    done = []

    def fault(procs):
        pids = [ckpt / "pid.0", ckpt / "pid.1"]
        if done or not all(p.exists() for p in pids):
            return
        w0, w1 = (int(p.read_text()) for p in pids)
        parent = {w: int(open(f"/proc/{w}/stat").read().rsplit(")", 1)[1].split()[1])
                  for w in (w0, w1)}
        assert parent == {w0: procs[0].pid, w1: procs[1].pid}, parent  # rank r on agent r
        os.kill(procs[1].pid, signal.SIGKILL)  # node 1 is gone: its agent...
        os.kill(w1, signal.SIGKILL)  # ...and its worker
        os.kill(w0, signal.SIGKILL)  # rank 0's next collective would fail: it fails now
        done.append(True)

    results = torchrun.run_parallel(
        [agent(1, 2), agent(0, 2)], timeout=120, during=fault,
        env={**torchrun.BACKEND_ENV["gloo"], resume.HOLD_VAR: 60,
             "DPBOOK_TEST_PG_TIMEOUT_S": 20})
    return done, results, out


@pytest.mark.distributed
def test_an_elastic_job_loses_a_whole_node_and_goes_on_with_the_other(two_node_runs,
                                                                   uninterrupted):
    """Issue 26, item 2: ``--nnodes=1:2``, two agents (emulated nodes, one worker each). After
    the first checkpoint the agent of rank 1 dies with its worker (a node lost), and the worker of
    rank 0 fails (as its next collective would). With one restart left, the surviving agent meets
    alone (one node is enough: ``1:2``), its new worker resumes from the checkpoint rank 0 picks,
    now with world size 1, and the job ends with the weights of an uninterrupted run (the data of
    a step does not depend on the world size: ``resume.batch_indices``)."""
    import signal

    done, results, out = two_node_runs["elastic"]
    detail = "\n".join(f"--- agent {r.node_rank} (mã thoát {r.returncode}) ---\n{r.output[-3000:]}"
                       for r in results)
    assert done, detail
    assert results[0].returncode == 0 and results[1].returncode == -signal.SIGKILL, detail
    state, summary = resume.read_result(str(out))
    assert [(a["attempt"], a["from_step"], a["world_size"]) for a in summary["attempts"]] == [
        (0, 0, 2), (1, 4, 1)], summary["attempts"]
    expected = uninterrupted
    for k, v in expected["state"].items():
        torch.testing.assert_close(state[k], v, rtol=0, atol=1e-12)
