"""``dpbook.tools.gpu_pages``: the checks ``make gpu-check`` runs for part 4.2, run here with gloo on
CPU so their plumbing is tested on every machine (on a GPU box they run with NCCL)."""

import pytest

from dpbook.tools import gpu_pages


def test_device_must_match_backend():
    gpu_pages._expect_device("cpu", "gloo")
    gpu_pages._expect_device("cuda:1", "nccl")
    with pytest.raises(AssertionError, match="nccl"):
        gpu_pages._expect_device("cpu", "nccl")
    with pytest.raises(AssertionError, match="gloo"):
        gpu_pages._expect_device("cuda:0", "gloo")


def test_a_failing_page_is_reported_and_the_rest_still_run(monkeypatch):
    def broken(gpus, backend, timeout):
        raise RuntimeError("hỏng có chủ ý\ndòng thứ hai")

    monkeypatch.setattr(gpu_pages, "PAGES", {"a": broken, "b": lambda w, b, t: f"{w} {b}"})
    rows = gpu_pages.run_pages(2, backend="gloo", timeout=5)
    assert [(r["page"], r["ok"]) for r in rows] == [("a", False), ("b", True)]
    assert rows[0]["detail"] == "RuntimeError: hỏng có chủ ý" and rows[1]["detail"] == "2 gloo"


# These two checks run exactly what a page runs on CPU (Bài A's cell runs the checker on the
# solution, 4.2.6's cell the killed-and-resumed script), so here only their wiring is tested.
SAME_AS_A_PAGE = {"Bài A", "4.2.6 chịu lỗi"}


@pytest.mark.distributed
@pytest.mark.parametrize("page", [p for p in gpu_pages.PAGES if p not in SAME_AS_A_PAGE])
def test_every_page_check_passes_on_cpu(page):
    # "auto" as in make gpu-check's fallbacks: every launcher chooses, here gloo on the CPU.
    detail = gpu_pages.PAGES[page](2, "auto", 240)
    assert isinstance(detail, str) and detail and not detail.startswith("bỏ qua")


def test_lab_a_check_runs_the_solution_on_the_ranks_and_backend_asked(monkeypatch):
    from types import SimpleNamespace

    from dpbook.labs.lab_a import SOLUTION, checker

    calls = []

    def fake_check(path, **kw):
        calls.append((path, kw))
        return SimpleNamespace(passed=kw["nproc_per_node"] == 2, items=[1, 2, 3], failed=["x"])

    monkeypatch.setattr(checker, "check", fake_check)
    assert gpu_pages.PAGES["Bài A"](2, "nccl", 7) == "lời giải qua 3 mục kiểm tra"
    assert calls == [(SOLUTION, {"nproc_per_node": 2, "timeout": 7, "verbose": False,
                                 "backend": "nccl"})]
    with pytest.raises(AssertionError, match="trượt"):
        gpu_pages.PAGES["Bài A"](4, "nccl", 7)
    assert gpu_pages.PAGES["Bài A"](3, "nccl", 7).startswith("bỏ qua")


def test_resume_check_kills_the_last_rank_and_wants_a_restart_from_the_checkpoint(monkeypatch):
    import json
    import os

    from dpbook import torchrun

    seen = {}

    def fake_run(module, args, **kw):
        seen.update(module=module, args=args, **kw)
        out = args[args.index("--out") + 1]
        with open(os.path.join(os.path.dirname(out), "final.json"), "w", encoding="utf-8") as f:
            json.dump({"attempts": [{"from_step": 0}, {"from_step": seen["starts"]}]}, f)

    monkeypatch.setattr(torchrun, "run", fake_run)
    seen["starts"] = 4
    assert gpu_pages.PAGES["4.2.6 chịu lỗi"](3, "gloo", 9).endswith("từ bước 4")
    assert seen["module"] == "dpbook.scripts.resume" and seen["nproc_per_node"] == 3
    assert seen["max_restarts"] == 1 and seen["backend"] == "gloo" and seen["timeout"] == 9
    args = seen["args"]
    assert args[args.index("--kill-rank") + 1] == 2 and args[args.index("--ckpt-every") + 1] == 4
    seen["starts"] = 0
    with pytest.raises(AssertionError, match=r"\[0, 4\]"):
        gpu_pages.PAGES["4.2.6 chịu lỗi"](3, "gloo", 9)


def test_a_run_on_the_wrong_backend_fails_its_check(monkeypatch):
    gpu_pages._expect_run("cpu", "gloo", 2, "auto")  # this machine: auto means gloo
    # A GPU host where the run should have used NCCL but fell back silently:
    monkeypatch.setattr(gpu_pages, "_expected", lambda ws, backend: "nccl")
    with pytest.raises(AssertionError, match="chạy bằng gloo, cần nccl"):
        gpu_pages._expect_run("cpu", "gloo", 2, "auto")


def test_the_failure_checks_skip_with_a_reason_on_one_gpu():
    """The review's D9: on a 1-GPU box the page checks run on 1 rank, where no rank can crash
    under a waiting peer; the check says so instead of failing `make gpu-check`."""
    detail = gpu_pages.PAGES["4.2.5 sập, lệch batch"](1, "gloo", 60)
    assert detail.startswith("bỏ qua") and "2 rank" in detail
