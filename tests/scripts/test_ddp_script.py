"""Section 4.2.2: the complete DDP script ``dpbook.scripts.ddp_script`` (also ``python -m dpbook.scripts.ddp_script``)."""

import sys

import pytest
import torch
from dpbook.scripts import ddp_script
from dpbook import launch, torchrun
from dpbook.models import build_mlp

F64 = {"dtype": "float64", "num_samples": 64, "eval_samples": 20, "progress": False}


@pytest.mark.parametrize("kwargs, match", [
    ({"epochs": 0}, "epochs"), ({"batch_size": 1.5}, "batch_size"), ({"lr": 0}, "lr"),
    ({"momentum": 1.0}, "momentum"), ({"dtype": "bfloat16"}, "dtype"),
    ({"resume": True}, "checkpoint"), ({"seed": -1}, "seed"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ddp_script.ScriptConfig(**kwargs)


def test_loader_needs_a_whole_number_of_steps():
    cfg = ddp_script.ScriptConfig(num_samples=60, batch_size=8)
    with pytest.raises(ValueError, match="chia hết cho .* = 16"):
        ddp_script.make_loader(cfg, 0, 2)


def test_progress_bar_prints_a_few_lines(capsys):
    assert ddp_script.progress_line("e", 5, 10, 0.5, width=10) == "e |█████·····| 5/10 loss=0,5000"
    bar = ddp_script.Progress("e", 16, enabled=True)
    for _ in range(16):
        bar.update(1.0)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("| ")[1].split()[0] for line in lines] == ["4/16", "8/16", "12/16", "16/16"]


def test_single_process_run_saves_a_plain_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    cfg = ddp_script.ScriptConfig(epochs=2, batch_size=8, checkpoint=str(ckpt), **F64)
    hist = ddp_script.run(0, 1, cfg)
    assert hist["steps_per_epoch"] == 8 and len(hist["losses"]) == 16
    assert hist["losses"][-1] < hist["losses"][0]
    assert [e["epoch"] for e in hist["evals"]] == [1, 2]
    assert hist["evals"][-1]["samples"] == 20 == hist["evals"][-1]["local_samples"]
    model = build_mlp(**ddp_script.MODEL).double()
    assert ddp_script.load_checkpoint(str(ckpt), model) == 1  # saved after epoch index 1
    assert not any(k.startswith("module.") for k in model.state_dict())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in hist["state"].items())
    assert not (tmp_path / "ckpt.pt.tmp").exists()


def test_resume_continues_exactly(tmp_path):
    full = ddp_script.run(0, 1, ddp_script.ScriptConfig(epochs=2, **F64))
    ckpt = str(tmp_path / "c.pt")
    first = ddp_script.run(0, 1, ddp_script.ScriptConfig(epochs=1, checkpoint=ckpt, **F64))
    rest = ddp_script.run(0, 1, ddp_script.ScriptConfig(epochs=2, checkpoint=ckpt, resume=True,
                                                        **F64))
    assert rest["start_epoch"] == 1
    assert first["losses"] + rest["losses"] == full["losses"]  # momentum restored too
    assert all(torch.equal(rest["state"][k], v) for k, v in full["state"].items())


@pytest.mark.distributed
def test_ddp_with_no_sync_accumulation_equals_one_process_on_the_global_batch():
    # 2 ranks x 2 micro-batches of 4 samples against one process with batches of 16.
    ddp_cfg = ddp_script.ScriptConfig(epochs=2, batch_size=4, accumulation_steps=2, **F64)
    ranks = launch.spawn(ddp_script.run, ddp_cfg, world_size=2, backend="gloo", timeout=120,
                         output="none")
    ref = ddp_script.run(0, 1, ddp_script.ScriptConfig(epochs=2, batch_size=16, **F64))
    assert ranks[0]["backend"] == "gloo" and len(ref["losses"]) == 8
    for r in ranks:
        assert r["losses"] == pytest.approx(ref["losses"], abs=1e-12)
        assert r["evals"][-1]["samples"] == 20 and r["evals"][-1]["local_samples"] == 10
        assert r["evals"][-1]["mse"] == pytest.approx(ref["evals"][-1]["mse"], abs=1e-12)
        for k, v in ref["state"].items():
            torch.testing.assert_close(r["state"][k], v, rtol=0, atol=1e-10)
    assert not torch.equal(ranks[0]["state"]["head.weight"], build_mlp().double().head.weight)


def test_python_dash_m_runs_one_process(tmp_path):
    out = torchrun.run_process([sys.executable, "-m", "dpbook.scripts.ddp_script", "--epochs", "1",
                                  "--checkpoint", str(tmp_path / "c.pt")], timeout=60)
    assert out.returncode == 0, out.stdout
    assert "Xong: 1 process" in out.stdout and (tmp_path / "c.pt").exists()


def test_bad_command_line_exits_with_a_vietnamese_message():
    out = torchrun.run_process([sys.executable, "-m", "dpbook.scripts.ddp_script", "--epochs", "0"],
                                 timeout=60)
    assert out.returncode == 2 and "epochs phải là số nguyên" in out.stdout


@pytest.mark.distributed
def test_torchrun_two_processes(tmp_path):
    cmd = torchrun.command("dpbook.scripts.ddp_script", ["--epochs", "1", "--num-samples", "64",
                                            "--checkpoint", str(tmp_path / "c.pt")],
                           nproc_per_node=2)
    out = torchrun.run_process(cmd, timeout=90)
    assert out.returncode == 0, out.stdout
    assert "Xong: 2 process" in out.stdout and out.stdout.count("Xong:") == 1  # rank 0 only
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    assert ckpt["epoch"] == 0 and ckpt["model"].keys() == build_mlp().state_dict().keys()


