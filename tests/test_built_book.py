"""Build the book as ``make book`` does (``-W``, notebooks executed), then read it in a real
headless browser with the network off."""

import os
import pathlib
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import yaml

from dpbook.tools import execution_cache

pytestmark = [pytest.mark.slow, pytest.mark.builds_book]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def html(root, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("book")
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["bibtex_bibfiles"] = [str(root / b) for b in config["bibtex_bibfiles"]]
    # The execution cache that `make book` uses and that the notebook tests fill: after them
    # the book is built from their runs, not executed a second time (dpbook.tools).
    config["execute"]["cache"] = str(root / execution_cache.DEFAULT)
    cfg = out / "_config.yml"
    cfg.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    jb = pathlib.Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", str(root), "-W", "--keep-going", "--config", str(cfg),
         "--path-output", str(out)],
        capture_output=True, text=True, timeout=900, env=os.environ | {"PYTHONWARNINGS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    return out / "_build" / "html"


def test_pages_exist_with_real_outputs(html):
    for page in ("book/intro", "book/ch04/index", "book/ch04/moi-truong", "book/glossary",
                 "book/widgets/ring-allreduce", "book/widgets/fsdp-lifecycle"):
        assert (html / f"{page}.html").exists(), page
    env = (html / "book/ch04/moi-truong.html").read_text(encoding="utf-8")
    assert "nhận [3.0, 3.0, 3.0, 3.0]" in env or "nhận [" in env  # output of the real run
    assert "Chế độ" in env
    # hidden check cells run but do not show
    assert "assert all(r[" not in env
    # formulas render from the book's own MathJax copy, not from a CDN
    assert "cdn.jsdelivr" not in env and (html / "_static/mathjax/tex-chtml.js").exists()


class _Outputs(HTMLParser):
    """The text of a built page's cell outputs (``div.cell_output``)."""

    def __init__(self):
        super().__init__()
        self.depth, self.parts = 0, []

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if self.depth or (tag == "div" and "cell_output" in classes):
            self.depth += tag not in VOID

    def handle_endtag(self, tag):
        if self.depth and tag not in VOID:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data)


VOID = {"br", "img", "hr", "meta", "link", "input", "source", "col", "wbr"}


def test_printed_numbers_follow_the_rules(html):
    """What the cells printed, as a reader sees it: no comma thousands, no decimal point before
    a unit (``tests/test_style.py`` checks the code that prints; this checks the result)."""
    from test_style import NUMBERS, _find

    rules = [r for r in NUMBERS if r[0] in ("dấu phẩy hàng nghìn", "dấu chấm thập phân")]
    found = []
    for page in sorted(html.rglob("*.html")):
        parser = _Outputs()
        parser.feed(page.read_text(encoding="utf-8"))
        found += _find(rules, [(page.relative_to(html).as_posix(), "".join(parser.parts))])
    assert not found, f"{len(found)} con số in ra sai quy ước:\n" + "\n".join(found)


NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="cần Chromium (gói Debian `chromium`); `make test` tự cài khi chạy với quyền root")


@pytest.fixture
def open_page(html, root):
    """Open a built page from disk in headless Chromium, offline; yield (page, first player);
    afterwards save the player's screenshot under ``_build/screenshots`` and require that no
    JavaScript error was logged and nothing was fetched from the network."""
    from playwright.sync_api import sync_playwright

    shots = root / "_build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        context = browser.new_context(offline=True, viewport={"width": 1300, "height": 1000})
        page = context.new_page()
        page.on("pageerror", lambda e: problems.append(f"JS error: {e}"))
        page.on("console",
                lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.route("http*://**", lambda route: (problems.append(f"network: {route.request.url}"),
                                                route.abort()))
        opened = []

        def _open(path: str, shot: str):
            page.goto((html / path).as_uri())
            player = page.locator(".dpb-player").first
            player.scroll_into_view_if_needed()
            opened.append((player, shots / shot))
            return page, player

        yield _open
        for player, shot in opened:
            player.screenshot(path=str(shot))
        browser.close()
    assert problems == [], problems


@NEEDS_CHROMIUM
def test_ring_player_works_offline(open_page):
    page, player = open_page("book/widgets/ring-allreduce.html", "ring.png")
    assert player.is_visible()
    step = player.locator(".dpb-step")
    assert step.inner_text() == "1 / 7"
    player.locator(".dpb-next").click()
    assert step.inner_text() == "2 / 7"
    player.focus()
    page.keyboard.press("ArrowRight")
    assert step.inner_text() == "3 / 7"
    assert "Reduce-scatter, bước 2/3" in player.locator(".dpb-caption").inner_text()
    # a second player on the same page is independent
    assert page.locator(".dpb-player").nth(1).locator(".dpb-step").inner_text() == "1 / 15"


@NEEDS_CHROMIUM
def test_fsdp_player_works_offline(open_page):
    page, player = open_page("book/widgets/fsdp-lifecycle.html", "fsdp.png")
    assert player.is_visible()
    step = player.locator(".dpb-step")
    assert step.inner_text().startswith("1 / ")
    player.focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert step.inner_text().startswith("3 / ")
