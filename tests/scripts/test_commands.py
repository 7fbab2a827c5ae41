"""Every command a reader copies runs here (issue 26, item 3): the README's torchrun lines, the two
plain scripts of 4.2.2 and 4.2.3 (``scripts/train_ddp.py``, ``scripts/train_fsdp.py``), the
two-node command of 4.2.4 (two agents on this machine) and 4.2.4's SLURM batch script under a
stand-in ``srun`` that starts its tasks here with the ``SLURM_*`` variables a real one sets.

What only the tests need lives here, not in the scripts: the time limit (``run_process`` kills
the whole tree), the hidden GPUs (the emulated nodes of one machine would share ``cuda:0``), and a
free rendezvous port. The weights are checked against an independent model: one process on the
global batch, written below in plain PyTorch, must reach the same weights to float32 rounding.
"""

import json
import os
import random
import re
import shutil
import socket
import stat
import sys
from pathlib import Path

import pytest
import torch
from dpbook import torchrun
from dpbook.pages import multi_node
from torch.utils.data import DistributedSampler, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "code" / "dpbook" / "scripts"
BIN = Path(sys.executable).parent
CPU = {"CUDA_VISIBLE_DEVICES": ""}  # the CPU path: gloo (the GPU path: make gpu-check)
pytestmark = pytest.mark.distributed


def readme_commands() -> list[str]:
    """The torchrun lines of the README's section on scripts, comments stripped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Chạy script huấn luyện ngoài notebook", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines()
            if line.startswith(".venv/bin/torchrun")]


def as_run(line: str) -> list[str]:
    """A README line with the repository's .venv replaced by the one running the tests."""
    return [str(BIN / w[len(".venv/bin/"):]) if w.startswith(".venv/bin/") else w
            for w in line.split()]


def one_process(kind: str, epochs: int, batch: int) -> tuple[dict, dict]:
    """The scripts' training on ONE process with the global batch, in plain PyTorch: the same
    seed, data, model and sampler order, no process group. DDP and FSDP on N ranks with
    ``batch // N`` each must reach these weights. Returns (final, initial) weights."""
    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    data = TensorDataset(x, x @ torch.randn(16, 1) + 0.1 * torch.randn(4096, 1))
    nn = torch.nn
    if kind == "ddp":
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    else:
        model = nn.Sequential(*[nn.Sequential(nn.Linear(16 if i == 0 else 64, 64), nn.ReLU())
                                for i in range(3)], nn.Linear(64, 1))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = DistributedSampler(data, num_replicas=1, rank=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)
        for k in range(0, len(order), batch):
            xb, yb = data[order[k:k + batch]]
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.state_dict(), initial


def assert_same_weights(state: dict, reference: tuple[dict, dict]) -> None:
    ref, initial = reference
    assert list(state) == list(ref)
    for k, v in ref.items():
        torch.testing.assert_close(state[k], v, rtol=0, atol=1e-4)
    # the comparison means something: training moved the weights much farther than that
    assert max((ref[k] - initial[k]).abs().max().item() for k in ref) > 1e-2


@pytest.fixture(scope="module")
def lines():
    found = readme_commands()
    assert len(found) == 3, found
    return found


def test_readme_ddp_line_trains_like_one_process_on_the_global_batch(lines, tmp_path):
    (line,) = [s for s in lines if "train_ddp" in s]
    out = torchrun.run_process(as_run(line), timeout=120, env=CPU, cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    epochs = int(line.split("--epochs ")[1].split()[0])
    assert [m.group(1) for m in re.finditer(r"^epoch (\d+): loss", out.stdout, re.M)] == [
        str(e) for e in range(epochs)]  # rank 0 alone prints
    state = torch.load(tmp_path / "_build" / "runs" / "ddp.pt", weights_only=True)
    assert_same_weights(state, one_process("ddp", epochs, 2 * 32))
    assert {p.name for p in tmp_path.iterdir()} == {"_build"}


def test_readme_fsdp_line_saves_dcp_shards_that_hold_the_one_process_weights(lines, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    (line,) = [s for s in lines if "train_fsdp" in s]
    out = torchrun.run_process(as_run(line), timeout=120, env=CPU, cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    epochs = int(line.split("--epochs ")[1].split()[0])
    ckpt = tmp_path / "_build" / "runs" / "fsdp"
    assert sorted(p.name for p in ckpt.iterdir()) == [f"epoch_{e}" for e in range(epochs)]
    last = ckpt / f"epoch_{epochs - 1}"
    assert sorted(p.name for p in last.iterdir()) == [".metadata", "__0_0.distcp",
                                                      "__1_0.distcp"]  # one file per rank
    dcp_to_torch_save(last, tmp_path / "full.pt")
    saved = torch.load(tmp_path / "full.pt", weights_only=True)
    assert_same_weights(saved["model"], one_process("fsdp", epochs, 2 * 32))


def test_readme_resume_line_runs_and_writes_only_under_build_runs(lines, tmp_path):
    (line,) = [s for s in lines if "dpbook.scripts.resume" in s]
    out = torchrun.run_process(as_run(line), timeout=150, env=CPU, cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    assert out.stdout.count("huấn luyện từ đầu.") == 1  # rank 0 alone says it
    assert {p.name for p in tmp_path.iterdir()} == {"_build"}
    assert {p.name for p in (tmp_path / "_build" / "runs").iterdir()} == {
        "ckpt", "final.pt", "final.json"}


def test_the_scripts_a_reader_copies_are_plain_pytorch():
    for name in ("train_ddp.py", "train_fsdp.py"):
        text = (SCRIPTS / name).read_text(encoding="utf-8")
        assert "dpbook" not in text.replace("dpbook.scripts", "")  # no import of the package
        assert "timeout" not in text  # PyTorch's default timeouts
        for needed in ("os.environ[\"LOCAL_RANK\"]", "init_process_group(\"nccl\", device_id=",
                       "init_process_group(\"gloo\")", "torch.cuda.set_device(",
                       "DistributedSampler(", "sampler.set_epoch(epoch)",
                       "finally:\n        dist.destroy_process_group()"):
            assert needed in text, (name, needed)
        assert len(text.splitlines()) <= 60


def test_two_node_command_of_4_2_4_on_two_agents(tmp_path):
    """4.2.4's command, typed on each node, with this machine standing for both."""
    shutil.copy(SCRIPTS / "train_ddp.py", tmp_path)
    port = torchrun.free_port()
    cmd = multi_node.two_node_command(f"127.0.0.1:{port}", nproc_per_node=1,
                                      checkpoint=str(tmp_path / "ddp.pt"))
    assert cmd.split()[0] == "torchrun"
    argv = [str(BIN / "torchrun")] + cmd.split()[1:]
    results = torchrun.run_parallel([argv, argv], timeout=150, env=CPU, cwd=tmp_path)
    assert [r.returncode for r in results] == [0, 0], [r.output for r in results]
    assert sum(r.output.count("epoch 2: loss") for r in results) == 1
    state = torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert_same_weights(state, one_process("ddp", 3, 2 * 32))


STAND_IN_SRUN = """#!/bin/bash
# Stand-in for srun on one machine: one task per node (--ntasks-per-node=1), started here, each
# with the variables srun sets for a task; exits with the first failure.
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_LOCALID=0 SLURM_NTASKS=$SLURM_NNODES \\
  SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=$SLURM_NNODES SLURMD_NODENAME=node$i "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""

STAND_IN_SCONTROL = """#!/bin/bash
# Stand-in for 'scontrol show hostnames LIST': one host name a line.
[ "$1 $2" = "show hostnames" ] && tr ',' '\\n' <<< "$3"
"""


def slurm_script() -> str:
    """The batch script printed on 4.2.4, as the reader copies it."""
    nb = json.loads((ROOT / "book/ch04/p2/04-torchrun.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "#SBATCH" in text:
            return text.split("```bash\n", 1)[1].split("```", 1)[0]
    raise AssertionError("4.2.4 không còn script SLURM")


def free_job_id() -> int:
    """A job id whose port (the script derives it from the id) is free on this machine."""
    for _ in range(100):
        job = random.randrange(100000, 999999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 20000 + job % 10000))
                return job
            except OSError:
                continue
    raise RuntimeError("không tìm được cổng trống")


def test_slurm_batch_script_of_4_2_4_under_a_stand_in_srun(tmp_path):
    script = slurm_script()
    assert "srun bash -c 'torchrun" in script  # single quotes: expanded on each node
    (tmp_path / "job.sh").write_text(script, encoding="utf-8")
    shutil.copy(SCRIPTS / "train_ddp.py", tmp_path)
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in (("srun", STAND_IN_SRUN), ("scontrol", STAND_IN_SCONTROL)):
        (fake / name).write_text(text)
        (fake / name).chmod(stat.S_IRWXU)
    job = free_job_id()
    env = {**CPU, "PATH": f"{fake}:{BIN}:/usr/bin:/bin", "SLURM_JOB_ID": str(job),
           "SLURM_JOB_NAME": "ddp", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_NODELIST": "127.0.0.1,127.0.0.1", "SLURM_GPUS_ON_NODE": "1",
           "SLURM_CPUS_PER_TASK": "1",
           "SLURM_SUBMIT_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = torchrun.run_process(["bash", "job.sh"], timeout=180, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    state = torch.load(tmp_path / "ket-qua" / str(job) / "ddp.pt", weights_only=True)
    assert_same_weights(state, one_process("ddp", 3, 2 * 32))


PAGES = ("02-ddp-day-du", "03-fsdp-day-du", "04-torchrun")


def solution_listings() -> list[tuple[str, str]]:
    """(page, code) of every ```python listing inside an exercise solution of 4.2.2-4.2.4."""
    found = []
    for page in PAGES:
        nb = json.loads((ROOT / f"book/ch04/p2/{page}.ipynb").read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            text = "".join(cell["source"])
            for sol in text.split("{solution}")[1:]:
                sol = sol.split("\n````", 1)[0]
                found += [(page, block.split("```", 1)[0])
                          for block in sol.split("```python\n")[1:]]
    return found


def printed_as_commented(code: str) -> list[str]:
    """What a listing says it prints: its comment-only lines, and the comment after a
    ``print(...)`` on the same line, as words."""
    words = []
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("# "):
            words += stripped[2:].split()
        elif stripped.startswith("print(") and "  # " in line:
            words += line.split("  # ", 1)[1].split()
    return words


@pytest.mark.parametrize("page, code", solution_listings(),
                         ids=[f"{p}-{i}" for i, (p, _) in enumerate(solution_listings())])
def test_solution_code_runs_as_printed(page, code, capsys):
    """Issue 26, item 3: the solutions' code runs as printed and prints what its comments say."""
    exec(compile(code, f"<{page}>", "exec"), {"__name__": "__solution__"})
    out = capsys.readouterr().out.replace("\u202f", " ")
    assert out.split() == [w for w in " ".join(printed_as_commented(code)).replace(
        "\u202f", " ").split()], out
