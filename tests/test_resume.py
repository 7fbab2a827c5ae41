"""Section 4.2.6 (fault tolerance): ``dpbook.resume``: arguments, the step-indexed data order,
complete checkpoints only, the cost model, and one real crash and restart under torchrun."""

import math

import pytest
import torch
from dpbook import resume, torchrun


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


def test_torchrun_events_shortens_agent_lines():
    log = ("I1129 18:16:07.128000 4688 .venv/lib/python3.11/site-packages/torch/distributed/"
           "elastic/agent/server/api.py:942] [default] Worker group FAILED. 2/2 attempts left\n"
           "something else\n")
    assert resume.torchrun_events(log, ["Worker group"]) == [
        "I api.py:942] [default] Worker group FAILED. 2/2 attempts left"]


def single_process_reference(c):
    """The same training in one process, no wrapper: Adam on each whole global batch."""
    from dpbook.averaging import loss_fn
    from dpbook.data import synthetic_regression
    from dpbook.models import build_mlp

    model = build_mlp(seed=c.seed).to(torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    x, y = (t.to(torch.float64) for t in synthetic_regression(c.num_samples).tensors)
    for step in range(1, c.steps + 1):
        idx = resume.batch_indices(step, c)
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


@pytest.mark.distributed
def test_a_killed_rank_is_restarted_and_training_resumes(tmp_path):
    out = tmp_path / "final.pt"
    args = ["--steps", "6", "--ckpt-every", "2", "--kill-rank", "1", "--kill-step", "3",
            "--ckpt-dir", tmp_path / "ck", "--out", out]
    [agent] = torchrun.run("dpbook.resume", args, nproc_per_node=2, max_restarts=1,
                           timeout=120, env={"LOGLEVEL": "INFO"})
    assert agent.output.count("Worker group FAILED") == 1
    assert "restart_count=1" in agent.output and "exitcode: -9" in agent.output
    state, summary = resume.read_result(str(out))
    a0, a1 = summary["attempts"]
    assert (a0["from_step"], a0["last_step"], a0["steps_run"]) == (0, 3, 3)
    assert (a1["attempt"], a1["from_step"], a1["last_step"], a1["steps_run"]) == (1, 2, 6, 4)
    assert a1["downtime_s"] > 0 and summary["checkpoints"] == [2, 4, 6]
    # the 2-rank checkpoint of the last step, read by this single process, is the final model
    ckpt, step = resume.read_checkpoint(str(tmp_path / "ck"), 6)
    assert step == 6 and all(torch.equal(ckpt[k], state[k]) for k in state)
    # and it is what one process training on the same batches reaches (up to rounding)
    ref = single_process_reference(cfg(steps=6, ckpt_every=2))
    assert all(torch.allclose(state[k], ref[k], rtol=1e-9, atol=1e-12) for k in ref)
    assert not torch.allclose(state["head.weight"], ref["head.weight"] * 1.001)
