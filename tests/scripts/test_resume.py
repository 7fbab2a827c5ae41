"""Section 4.2.6 (fault tolerance): ``dpbook.scripts.resume``: arguments, the step-indexed data order,
complete checkpoints only and the cost model (the real crash and restart runs in 4.2.6 itself)."""

import math

import pytest
import torch
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


def test_torchrun_events_shortens_agent_lines():
    log = ("I1129 18:16:07.128000 4688 .venv/lib/python3.11/site-packages/torch/distributed/"
           "elastic/agent/server/api.py:942] [default] Worker group FAILED. 2/2 attempts left\n"
           "something else\n")
    assert resume.torchrun_events(log, ["Worker group"]) == [
        "I api.py:942] [default] Worker group FAILED. 2/2 attempts left"]
