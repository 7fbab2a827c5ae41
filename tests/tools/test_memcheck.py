"""``python -m dpbook.memcheck`` (issue 30): the ledger against what the ranks allocated, on the
book's model and on a learner-style model defined in a file outside the package. Each diagnosis
is produced by the mistake it names and not by a correct setup; bad input is refused in
Vietnamese before any process starts."""

import json
import multiprocessing
import subprocess
import sys
import textwrap

import pytest

from dpbook import memcheck, memory

BOOK = "dpbook.memcheck.examples:book_mlp"
LEARNER = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(32, 128)
            self.layers = nn.ModuleList(nn.Sequential(nn.Linear(128, 128), nn.GELU())
                                        for _ in range(6))
            self.out = nn.Linear(128, 8)

        def forward(self, x):
            x = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return self.out(x)


    def net():
        return Net(), torch.randn(16, 32)


    def big_batch():  # activations outweigh the state
        return Net(), torch.randn(2048, 32)


    def tiny():  # a model far smaller than its batch
        return nn.Linear(4, 4), torch.randn(4096, 4)


    def huge():  # 4e10 parameters: counted on the meta device, never allocated
        return nn.Linear(200_000, 200_000), torch.randn(2, 200_000)


    def not_a_pair():
        return Net()
''')


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    path = tmp_path_factory.mktemp("hoc_vien") / "mo_hinh.py"
    path.write_text(LEARNER, encoding="utf-8")
    return str(path)


def _codes(report):
    return {d["code"] for d in report.diagnoses}


def _state_matches_the_ledger(report):
    for r in report.ranks:
        for c in ("parameters", "gradients", "optimizer", "buffers"):
            assert r["measured"][c] == r["predicted"][c], (c, r)
        # every byte of the measured peak has a category
        assert sum(r["peak"]["parts"].values()) == r["peak"]["measured"]


pytestmark = pytest.mark.distributed


def test_ddp_bucket_copy_is_measured_and_diagnosed():
    copy = memcheck.run(BOOK, "ddp", steps=2)
    view = memcheck.run(BOOK, "ddp-view", steps=2)
    _state_matches_the_ledger(copy)
    _state_matches_the_ledger(view)
    r = copy.ranks[0]["measured"]
    assert r["buffers"] == r["gradients"] > 0 and view.ranks[0]["measured"]["buffers"] == 0
    assert _codes(copy) == {"bucket_copy"} and _codes(view) == set()
    text = memcheck.table(copy)
    assert "bộ đệm giao tiếp" in text and "gradient_as_bucket_view=True" in text


def test_fsdp2_units_each_block_shards_and_says_nothing(learner):
    report = memcheck.run(f"{learner}:net", "fsdp2", nproc=4)
    _state_matches_the_ledger(report)  # the Linear sizes divide by 4: no padding
    assert _codes(report) == set()
    p = report.ranks[0]
    assert p["predicted"]["parameters"] == memory.vram_ledger(104_328, 4, "FULL_SHARD").params


def test_one_unit_for_the_whole_model_is_single_unit(learner):
    auto = memcheck.run(f"{learner}:net", "fsdp2")
    root = memcheck.run(f"{learner}:net", "fsdp2", wrap="root")
    assert "single_unit" in _codes(root) and "single_unit" not in _codes(auto)
    # the whole model gathered at once: a higher peak than one block at a time
    assert root.ranks[0]["peak"]["measured"] > auto.ranks[0]["peak"]["measured"]
    assert "small_world" in _codes(auto)  # N = 2


def test_units_kept_gathered_after_forward_is_no_reshard(learner):
    report = memcheck.run(f"{learner}:net", "fsdp2-noreshard")
    assert "no_reshard" in _codes(report) and "single_unit" not in _codes(report)
    _state_matches_the_ledger(report)


def test_large_batch_and_tiny_model(learner):
    big = memcheck.run(f"{learner}:big_batch", "ddp-view")
    assert "activations_dominate" in _codes(big) and "buffers_dominate" not in _codes(big)
    tiny = memcheck.run(f"{learner}:tiny", "ddp-view")
    assert "buffers_dominate" in _codes(tiny)


def test_zero1_on_two_ranks_is_small_world(learner):
    report = memcheck.run(f"{learner}:net", "zero1")
    assert {"small_world", "bucket_copy"} <= _codes(report)
    # whole parameter tensors per rank: the heaviest rank holds at least the even share
    assert max(r["measured"]["optimizer"] for r in report.ranks) >= \
        report.ranks[0]["predicted"]["optimizer"]


def test_the_command_prints_writes_json_and_a_plot(learner, tmp_path):
    out, fig = tmp_path / "r.json", tmp_path / "r.png"
    done = subprocess.run([sys.executable, "-m", "dpbook.memcheck", f"{learner}:net",
                           "--strategy", "ddp", "--steps", "2", "--json", str(out),
                           "--plot", str(fig)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "bộ nhớ đỉnh" in done.stdout and "[bucket_copy]" in done.stdout
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["strategy"] == "ddp" and data["world_size"] == 2 and len(data["ranks"]) == 2
    assert set(data["ranks"][0]["measured"]) == set(memcheck.CATEGORIES)
    assert {d["code"] for d in data["diagnoses"]} == {"bucket_copy"}
    assert fig.stat().st_size > 0


@pytest.mark.parametrize("spec, kwargs, words", [
    ("khong_co_module_nay:f", {}, "không import được"),
    ("dpbook.memcheck.examples:khong_co", {}, "không có hàm"),
    ("khong_co_dau_hai_cham", {}, "MODULE:FUNCTION"),
    ("LEARNER:not_a_pair", {}, "(model, batch)"),
    (BOOK, {"strategy": "zero4"}, "strategy"),
    (BOOK, {"nproc": 10_000}, "rank"),
    ("LEARNER:huge", {}, "không vừa"),
])
def test_bad_input_is_refused_before_any_process(learner, spec, kwargs, words):
    spec = spec.replace("LEARNER", learner)
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError) as err:
        memcheck.run(spec, **kwargs)
    assert words in str(err.value)
    assert set(multiprocessing.active_children()) <= before


def test_bad_input_on_the_command_line_exits_2_in_vietnamese(capsys):
    from dpbook.memcheck.__main__ import main

    assert main([BOOK, "--strategy", "x"]) == 2
    assert "memcheck: lỗi: strategy='x' không hợp lệ" in capsys.readouterr().err


def test_the_readmes_memcheck_commands_run_as_printed(root, tmp_path):
    """Every copyable command runs in a test: the README's two memcheck lines, from a copy of
    the repository's root (they write under _build/runs/), the first diagnosing DDP's bucket
    copy, the second (gradient_as_bucket_view=True) writing a JSON without it."""
    import os
    import shlex

    readme = (root / "README.md").read_text(encoding="utf-8")
    lines = [line for line in readme.splitlines() if line.startswith(".venv/bin/python -m dpbook.memcheck")]
    assert len(lines) == 2
    (tmp_path / "_build" / "runs").mkdir(parents=True)
    procs = []
    for line in lines:  # both at once: each is mostly a Python start and a launch
        argv = shlex.split(line)
        argv[0] = sys.executable
        procs.append(subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": str(root / "code")}))
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
        outs.append(out)
    assert "[bucket_copy]" in outs[0] and "[bucket_copy]" not in outs[1]
    data = json.loads((tmp_path / "_build" / "runs" / "memcheck.json").read_text(encoding="utf-8"))
    assert data["strategy"] == "ddp-view" and all(r["measured"]["buffers"] == 0
                                                  for r in data["ranks"])
