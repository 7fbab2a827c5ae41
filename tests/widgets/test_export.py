"""``python -m dpbook.widgets export DIR``: standalone, offline, presentation by default."""

import re
import shutil
import subprocess
import sys

import pytest

from dpbook.widgets import export


def test_export_writes_every_animation_and_an_index(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpbook.widgets", "export", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    stems = [stem for stem, _, _ in export.catalogue()]
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    # teaching order: the index lists the files in catalogue order
    assert re.findall(r'href="([^"]+)\.html"', index) == stems
    for stem in stems:
        html = (tmp_path / f"{stem}.html").read_text(encoding="utf-8")
        assert html.startswith("<!DOCTYPE html>") and 'lang="vi"' in html
        # presentation mode by default, in the lecture layout (one screen, no scrolling)
        assert 'class="dpb-player dpb-present dpb-lecture"' in html
        external = re.findall(r'(?:src|href)="(https?://[^"]+)"', html)
        assert external == [] and "<link" not in html
        assert len(html.encode()) < 1_000_000


def test_export_without_presentation(tmp_path):
    paths = export.export(tmp_path, presentation=False)
    assert all('class="dpb-player dpb-lecture"' in p.read_text(encoding="utf-8")
               for p in paths[1:])


# --- The exported pages in a real browser: one lecture screen each (issue 24) -----------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking"]
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="cần Chromium (gói Debian `chromium`); `make test` tự cài khi chạy với quyền root")
LECTURE = {"width": 1920, "height": 1080}  # a projector
PHONE = {"width": 390, "height": 844}
LECTURE_MIN_LABEL_PX = 24
PHONE_MIN_LABEL_PX = 11
# a frame counter written into a drawing ("bước 2/6"): the player's own is the only one allowed
COUNTER = re.compile(r"(?i)bước\s*\d+\s*/\s*\d+")

# The shown frame, measured as the audience sees it: each label's font size times the scale of
# its drawing on the screen (viewBox to CSS px), the page's size, the boxes of the parts.
MEASURE = """() => {
  const root = document.querySelector('.dpb-player');
  const svg = root.querySelector('.dpb-frame:not([hidden]) svg');
  const scale = svg.getScreenCTM().a;
  const labels = [...svg.querySelectorAll('text')].map(t => ({
    text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize) * scale}));
  const box = sel => { const e = root.querySelector(sel); if (!e) return null;
    const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, left: r.left,
      right: r.right, px: parseFloat(getComputedStyle(e).fontSize)}; };
  return {scrollHeight: document.documentElement.scrollHeight,
          scrollWidth: document.documentElement.scrollWidth, labels,
          caption: box('.dpb-caption'), controls: box('.dpb-controls'), step: box('.dpb-step'),
          stepText: root.querySelector('.dpb-step').textContent,
          frames: root.querySelectorAll('.dpb-frame').length};
}"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    export.export(out)
    return out


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield b
        b.close()


def _inside(box, viewport) -> bool:
    return (box["top"] >= 0 and box["left"] >= 0 and box["bottom"] <= viewport["height"]
            and box["right"] <= viewport["width"])


def _every_frame(page):
    """Measure each frame of the page's player in turn (stepping with the → key)."""
    first = page.evaluate(MEASURE)
    seen = [first]
    for _ in range(first["frames"] - 1):
        page.keyboard.press("ArrowRight")
        seen.append(page.evaluate(MEASURE))
    return seen


@NEEDS_CHROMIUM
@pytest.mark.parametrize("stem", [stem for stem, _, _ in export.catalogue()])
def test_an_exported_page_is_one_lecture_screen(stem, exported, browser):
    """At 1920 × 1080: no scrolling; the caption, the controls and the counter on screen on every
    frame; no label under 24 px; one counter, which agrees with the frame shown; several frames;
    a link back to the index."""
    page = browser.new_page(viewport=LECTURE)
    problems = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto((exported / f"{stem}.html").as_uri())
    frames = _every_frame(page)
    n = frames[0]["frames"]
    assert n > 1, f"{stem}: chỉ có {n} khung hình, không phải một hình động"
    for k, m in enumerate(frames):
        where = f"{stem}, khung {k + 1}"
        assert m["scrollHeight"] <= LECTURE["height"], f"{where}: cao {m['scrollHeight']} px"
        assert m["scrollWidth"] <= LECTURE["width"], f"{where}: rộng {m['scrollWidth']} px"
        for part in ("caption", "controls", "step"):
            assert _inside(m[part], LECTURE), f"{where}: {part} ra ngoài màn hình: {m[part]}"
        small = min(m["labels"], key=lambda label: label["px"])
        assert small["px"] >= LECTURE_MIN_LABEL_PX, f"{where}: nhãn {small['px']:.1f} px: {small}"
        counters = [label["text"] for label in m["labels"] if COUNTER.search(label["text"])]
        assert counters == [], f"{where}: hình tự đánh số bước: {counters}"
        assert m["stepText"] == f"{k + 1} / {n}"
        assert m["step"]["px"] >= LECTURE_MIN_LABEL_PX, f"{where}: bộ đếm {m['step']['px']} px"
    assert page.locator(".dpb-step").count() == 1
    home = page.locator('a[href="index.html"]')
    assert home.count() == 1 and home.is_visible()
    box = home.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= LECTURE["height"]
    assert problems == []
    page.close()


def test_the_index_links_to_every_page_and_every_page_back(exported):
    pages = sorted(p.name for p in exported.glob("*.html") if p.name != "index.html")
    index = (exported / "index.html").read_text(encoding="utf-8")
    assert sorted(re.findall(r'href="([^"]+)"', index)) == pages
    for name in pages:
        assert 'href="index.html"' in (exported / name).read_text(encoding="utf-8"), name


@NEEDS_CHROMIUM
@pytest.mark.parametrize("presentation", [False, True])
def test_a_player_in_a_page_stays_readable_on_a_phone(presentation, tmp_path, browser):
    """In the book's pages on a 390 px phone the drawing keeps a readable width and scrolls
    sideways inside its own box; the page itself stays 390 px wide."""
    from dpbook.widgets import ledger, ring

    body = "".join(p.to_html() for p in (ring.player(8, presentation=presentation),
                                         ledger.player("llama-7b", presentation=presentation)))
    path = tmp_path / "phone.html"
    path.write_text('<!DOCTYPE html><html lang="vi"><head><meta charset="utf-8">'
                    '<meta name="viewport" content="width=device-width, initial-scale=1">'
                    '</head><body style="margin:0 12px">' + body + "</body></html>",
                    encoding="utf-8")
    page = browser.new_page(viewport=PHONE, is_mobile=True, has_touch=True)
    page.goto(path.as_uri())
    for k in range(2):
        m = page.evaluate(MEASURE.replace("document.querySelector('.dpb-player')",
                                          f"document.querySelectorAll('.dpb-player')[{k}]"))
        small = min(label["px"] for label in m["labels"])
        assert small >= PHONE_MIN_LABEL_PX, f"player {k}: nhãn nhỏ nhất {small:.1f} px"
        assert m["scrollWidth"] <= PHONE["width"], f"trang rộng {m['scrollWidth']} px"
    stage = page.locator(".dpb-stage").first
    assert stage.evaluate("e => e.scrollWidth > e.clientWidth")  # it scrolls, inside its box
    page.close()


@NEEDS_CHROMIUM
def test_full_screen_in_a_page_is_one_lecture_screen(tmp_path, browser):
    """The book's players (plain text size) in full screen at 1920 × 1080: the lecture layout
    and the presentation text sizes, so the tallest drawings fit with labels of 24 px or more."""
    from dpbook.widgets import dp_vs_ddp, ledger, ring

    for k, player in enumerate((dp_vs_ddp.player(4), ring.player(8),
                                ledger.player("llama-7b"))):
        path = tmp_path / f"full-{k}.html"
        path.write_text('<!DOCTYPE html><html lang="vi"><head><meta charset="utf-8"></head>'
                        '<body style="max-width:760px;margin:auto"><p>Văn bản.</p>'
                        + player.to_html() + "</body></html>", encoding="utf-8")
        page = browser.new_page(viewport=LECTURE)
        page.goto(path.as_uri())
        page.locator(".dpb-full").click()
        page.wait_for_function("() => document.fullscreenElement !== null")
        m = page.evaluate(MEASURE)
        small = min(label["px"] for label in m["labels"])
        assert small >= LECTURE_MIN_LABEL_PX, f"{player.title}: nhãn {small:.1f} px"
        for part in ("caption", "controls", "step"):
            assert _inside(m[part], LECTURE), f"{player.title}: {part} {m[part]}"
        page.close()
