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


@pytest.mark.distributed
@pytest.mark.parametrize("page", list(gpu_pages.PAGES))
def test_every_page_check_passes_on_cpu(page):
    # "auto" as in make gpu-check's fallbacks: every launcher chooses, here gloo on the CPU.
    detail = gpu_pages.PAGES[page](2, "auto", 240)
    assert isinstance(detail, str) and detail and not detail.startswith("bỏ qua")


def test_a_run_on_the_wrong_backend_fails_its_check(monkeypatch):
    gpu_pages._expect_run("cpu", "gloo", 2, "auto")  # this machine: auto means gloo
    # A GPU host where the run should have used NCCL but fell back silently:
    monkeypatch.setattr(gpu_pages, "_expected", lambda ws, backend: "nccl")
    with pytest.raises(AssertionError, match="chạy bằng gloo, cần nccl"):
        gpu_pages._expect_run("cpu", "gloo", 2, "auto")
