"""The chapter's self-check (``dpbook.widgets.quiz``, page ``book/ch04/tu-kiem-tra``): its
questions cover the four objectives with numbers from the package, and in a headless Chromium
with the network blocked a right and a wrong answer each get the right feedback."""

import shutil

import pytest

from dpbook import costs, memory
from dpbook.style import GB
from dpbook.widgets import quiz

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run"]


def test_at_least_four_questions_per_objective_each_with_its_explanations(root):
    qs = quiz.questions()
    assert len(qs) >= 16 and len({q.key for q in qs}) == len(qs)
    for objective in quiz.OBJECTIVES:
        assert sum(q.objective == objective for q in qs) >= 4, objective
    for q in qs:
        assert all(o.why for o in q.options) and len(q.options) >= 3
        assert (root / "book" / "ch04" / (q.link + ".ipynb")).exists(), q.link
        assert q.options[q.answer].why.startswith("Đúng")
        assert not any(o.why.startswith("Đúng") for i, o in enumerate(q.options) if i != q.answer)


def test_the_numeric_answers_are_the_formulas_of_the_pages():
    """Recomputed from first principles: a ring sends 2(N-1)/N of the data per GPU, FSDP three
    half-rings; DDP keeps parameters, gradients, Adam's two moments and the bucket copy."""
    by = {q.key: q for q in quiz.questions()}
    P, N = 10**9, 8
    assert by["ddp-byte"].options[by["ddp-byte"].answer].text == \
        f"{costs_text(2 * (N - 1) / N * 4 * P)}"
    fsdp = by["fsdp-byte"].options[by["fsdp-byte"].answer].text
    assert fsdp.startswith(costs_text(3 * (N - 1) / N * 4 * P)) and "(1,5 lần DDP)" in fsdp
    assert by["ddp-bo-nho"].options[by["ddp-bo-nho"].answer].text == f"{4 + 4 + 8 + 4} byte"
    assert by["batch"].options[by["batch"].answer].text == str(32 * 2 * 4)
    assert memory.vram_ledger(P, N, "DDP").total == 20 * P  # the package agrees with the count
    assert costs.ddp_step_bytes(4 * P, N).total == 2 * (N - 1) / N * 4 * P


def costs_text(nbytes):
    from dpbook import vi
    return f"{vi.number(nbytes / GB, 1, trim=True)} GB"


@pytest.mark.skipif(CHROMIUM is None, reason="cần Chromium (gói Debian `chromium`)")
def test_a_right_and_a_wrong_answer_get_their_feedback_offline(tmp_path):
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "quiz.html"
    page_file.write_text(f"<!doctype html><meta charset='utf-8'><body>{quiz.html()}</body>",
                         encoding="utf-8")
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            pg = browser.new_context(offline=True).new_page()
            pg.on("pageerror", lambda e: problems.append(f"JS: {e}"))
            pg.route("http*://**", lambda r: (problems.append(r.request.url), r.abort()))
            pg.goto(page_file.as_uri())
            q = next(q for q in quiz.questions() if q.key == "fsdp-loai")
            box = pg.locator(f'fieldset[data-key="{q.key}"]')
            feedback = box.locator(".phan-hoi")
            assert feedback.is_hidden()
            wrong = next(i for i in range(len(q.options)) if i != q.answer)
            box.locator(f'input[value="{wrong}"]').check()
            assert feedback.is_visible()
            text = feedback.inner_text()
            assert text.startswith("Chưa đúng.") and q.options[wrong].why in text
            assert feedback.locator("a").get_attribute("href") == q.link + ".html"
            box.locator(f'input[value="{q.answer}"]').check()
            assert feedback.inner_text().startswith("Đúng.")
            assert "dung" in feedback.get_attribute("class").split()
        finally:
            browser.close()
    assert problems == []
