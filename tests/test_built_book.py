"""Build the book as ``make book`` does (``-W``, notebooks executed; the ``built`` fixture in
``conftest.py``), then read it in a real headless browser with the network off."""

import re
import pathlib
import shutil
from html.parser import HTMLParser

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.builds_book]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_pages_exist_with_real_outputs(html):
    for page in ("book/intro", "book/ch04/index", "book/ch04/moi-truong", "book/glossary",
                 "book/widgets/ring-allreduce", "book/widgets/fsdp-lifecycle"):
        assert (html / f"{page}.html").exists(), page
    env = (html / "book/ch04/moi-truong.html").read_text(encoding="utf-8")
    # output of the real run: every rank received the sum of what all ranks sent
    rows = re.findall(r"rank (\d+) \([^)]*\): gửi \[([^\]]*)\] → nhận \[([^\]]*)\]", env)
    assert len(rows) >= 2, "moi-truong: không thấy kết quả AllReduce của các rank"
    sent = [[float(x) for x in s.split(",")] for _, s, _ in rows]
    for _, _, got in rows:
        assert [float(x) for x in got.split(",")] == [sum(col) for col in zip(*sent)]
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


def _search(page, html, query: str) -> list[tuple[str, int]]:
    """Search the built book from its search page (``file://``); the results, best first, as
    (link, score)."""
    from urllib.parse import quote

    page.goto((html / "search.html").as_uri() + "?q=" + quote(query))
    # _finishSearch writes the summary line. Not Search._pulse_status === -1: in Sphinx 7.4 a
    # pulse tick already scheduled sets it back to 0 within 500 ms (searchtools.js, startPulse),
    # and waiting on it timed out in 2 of 54 searches here.
    page.wait_for_function("() => document.querySelector('#search-results ul.search')"
                           " && Search.status && Search.status.innerText.trim() !== ''")
    links = page.locator("#search-results ul.search li > a")
    return [(a["href"], int(a["score"])) for a in links.evaluate_all(
        "els => els.map(e => ({href: e.getAttribute('href'), score: e.dataset.score}))")]


@pytest.fixture
def browser_page(html):
    """One offline headless Chromium page; no JavaScript error, console error or network
    request allowed."""
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_context(offline=True).new_page()
        page.on("pageerror", lambda e: problems.append(f"JS error: {e}"))
        page.on("console",
                lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.route("http*://**", lambda route: (problems.append(f"network: {route.request.url}"),
                                                route.abort()))
        yield page
        browser.close()
    assert problems == [], problems


@NEEDS_CHROMIUM
def test_search_folds_vietnamese_diacritics(browser_page, html):
    """``bo nho dinh`` finds what "bộ nhớ đỉnh" finds, pages with the whole phrase not below others
    (dpbook.tools.search_vi: folded index words, pairs of neighbouring words)."""
    from dpbook.tools.search_vi import fold

    texts = {p.relative_to(html).as_posix(): fold(_visible_text(p))
             for p in html.glob("book/**/*.html")}
    with_phrase = {page for page, text in texts.items() if "bo nho dinh" in text}
    apart = {page for page, text in texts.items()
             if "bo nho" not in text and "nho dinh" not in text}
    assert "book/ch04/p1/07-so-ke-toan-vram.html" in with_phrase
    plain = _search(browser_page, html, "bo nho dinh")
    assert plain == _search(browser_page, html, "bộ nhớ đỉnh")
    assert plain == _search(browser_page, html, "BỘ NHỚ ĐỈNH")
    assert plain[0][0] == "book/glossary.html#term-peak-memory"
    scores = {}
    for link, score in plain:
        scores.setdefault(link.split("#")[0], score)  # a page's best result comes first
    assert with_phrase <= set(scores), with_phrase - set(scores)
    # no page holding the syllables only apart outranks a page with the whole phrase
    # (with diacritics folded, "định" and "nhỏ" count as "dinh" and "nho")
    assert min(scores[p] for p in with_phrase) >= max(
        [scores[p] for p in apart if p in scores], default=0), scores
    assert fold("Đỉnh BỘ nhớ") == "dinh bo nho"


@NEEDS_CHROMIUM
def test_search_finds_ddp_in_any_case(browser_page, html):
    lower, upper = _search(browser_page, html, "ddp"), _search(browser_page, html, "DDP")
    assert lower == upper
    found = {link.split("#")[0] for link, _ in lower}
    assert {"book/ch04/p1/03-ddp.html", "book/ch04/p2/02-ddp-day-du.html",
            "book/ch04/p2/bai-a-ddp.html"} <= found
    assert "book/glossary.html#term-DistributedDataParallel-DDP" in dict(lower)


@NEEDS_CHROMIUM
def test_glossary_terms_and_glosses_find_each_other(browser_page, html, root):
    """The glossary's English term and its Vietnamese gloss are aliases: each finds the entry
    and the pages that use only the other name."""
    for query in ("peak memory", "bo nho dinh", "phép toán tập thể", "collective"):
        best = _search(browser_page, html, query)[0][0]
        term = "peak-memory" if query in ("peak memory", "bo nho dinh") else "collective"
        assert best == f"book/glossary.html#term-{term}", (query, best)
    # a page whose prose says "bộ nhớ đỉnh" but never "peak memory" is found by "peak memory"
    # (prose: a phrase that appears only in a cell's output is not indexed at all)
    only_vi = {page for page, text in _prose_by_page(root).items() if "bộ nhớ đỉnh" in text
               and "peak memory" not in text and page.startswith("book/ch04/")}
    assert only_vi
    found = {link.split("#")[0] for link, _ in _search(browser_page, html, "peak memory")}
    assert only_vi <= found, only_vi - found


def _prose_by_page(root: pathlib.Path) -> dict[str, str]:
    """Each page's prose (a notebook's markdown cells, a page's Markdown), lower-cased, keyed
    by the built page's path."""
    import json
    import unicodedata

    out = {}
    for src in (root / "book").rglob("*"):
        if src.suffix == ".ipynb":
            cells = json.loads(src.read_text(encoding="utf-8"))["cells"]
            text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        elif src.suffix == ".md":
            text = src.read_text(encoding="utf-8")
        else:
            continue
        page = src.relative_to(root).with_suffix(".html").as_posix()
        out[page] = unicodedata.normalize("NFC", text).lower()
    return out


def _visible_text(page: pathlib.Path) -> str:
    """The text of a built page's main content, as the search index reads it (NFC)."""
    import unicodedata

    class _Text(HTMLParser):
        def __init__(self):
            super().__init__()
            self.skip, self.parts = 0, []

        def handle_starttag(self, tag, attrs):
            self.skip += tag in ("script", "style")

        def handle_endtag(self, tag):
            self.skip -= tag in ("script", "style") and self.skip > 0

        def handle_data(self, data):
            if not self.skip:
                self.parts.append(data)

    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8").split('id="main-content"', 1)[-1])
    return unicodedata.normalize("NFC", " ".join(" ".join(parser.parts).split()))


# What a page's interface shows or says to a screen reader, outside the prose: text outside the
# article (bars, buttons, footer) and the article's own buttons and toggles, and every label
# (aria-label, title, placeholder, alt). Page and section titles are prose, not interface.
_INTERFACE_JS = """() => {
  const PROSE = "pre, code, kbd, samp, .highlight, .cell_output, mjx-container, script, style,"
    + " nav.bd-links a, .bd-toc-nav a, .toc-entry, .prev-next-title, .navbar-brand, .bd-article h1,"
    + " .bd-article h2, .bd-article h3, .bd-article h4";
  const CONTROLS = "button, summary, .headerlink, .copybtn";
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(PROSE)) continue;
    if (el.closest("article.bd-article") && !el.closest(CONTROLS)) continue;
    // what <noscript> holds is markup, as text
    const text = el.tagName === "NOSCRIPT" ? n.textContent.replace(/<[^>]*>/g, " ") : n.textContent;
    if (text.trim()) out.push(text.trim());
  }
  for (const el of document.body.querySelectorAll("*")) {
    // links to other pages carry their titles (prose), citations their references
    if (el.closest(PROSE) || el.matches("a.reference:not(.headerlink), .prev-next-area a"))
      continue;
    for (const a of ["aria-label", "title", "placeholder", "alt", "data-bs-title"]) {
      const v = el.getAttribute(a);
      if (v && v.trim()) out.push(v.trim());
    }
  }
  // a page's own title, wherever the theme repeats it, is prose too
  const headings = new Set([...document.querySelectorAll(".bd-article h1, .bd-article h2")]
    .map((h) => h.textContent.replace(/#$/, "").trim()));
  return [...new Set(out)].filter((s) => !headings.has(s));
}"""
# English that is the book's own vocabulary: names PyTorch uses (thuat-ngu.md), products, the
# seed's title words. Anything else English in the interface is a missing translation.
INTERFACE_ENGLISH = {
    "data", "parallelism", "pytorch", "ddp", "fsdp", "dp", "gpu", "cpu", "vram", "dpbook",
    "ipynb", "pdf", "md", "zero", "ctrl", "k", "javascript", "notebook", "zip",
}
# Short English words that are also spelled like Vietnamese syllables without diacritics.
_LOOKALIKES = {"by", "to", "on", "in", "an", "at", "as", "or", "no", "go", "do", "up", "it",
               "is", "me", "so", "of", "the", "and", "page", "main", "next", "top"}
_SYLLABLE = re.compile(r"(ngh|ng|nh|ch|gh|gi|kh|ph|qu|th|tr|[bcdghklmnprstvx])?"
                       r"[aeiouy]{1,3}(ch|ng|nh|[cmnpt])?")


def english_words(text: str) -> list[str]:
    """The words of ``text`` that are English and not the book's vocabulary."""
    found = []
    for word in re.findall(r"[^\W\d_]+", text):
        low = word.lower()
        if not low.isascii() or low in INTERFACE_ENGLISH:
            continue
        if low in _LOOKALIKES or not _SYLLABLE.fullmatch(low):
            found.append(word)
    return found


def test_english_detector_tells_interface_english_from_vietnamese():
    assert english_words("Toggle primary sidebar") == ["Toggle", "primary", "sidebar"]
    assert english_words("By Nhóm biên soạn dpbook") == ["By"]
    assert english_words("Search this book...") == ["Search", "this", "book"]
    assert english_words("Tìm trong sách…") == english_words("Chương 4 — Data parallelism") == []
    assert english_words("Theo hệ thống") == english_words("Hiện kết quả") == []


@NEEDS_CHROMIUM
@pytest.mark.parametrize("path", ["book/ch04/p1/07-so-ke-toan-vram.html",
                                  "book/ch04/p2/bai-a-ddp.html", "book/glossary.html",
                                  "book/ch04/index.html", "search.html"])
def test_interface_is_vietnamese(browser_page, html, path):
    """No English in the interface of a theory page, a lab, the glossary, the chapter's index
    and the search page (dpbook.tools.interface_vi, locale/vi/LC_MESSAGES/sphinx.po)."""
    browser_page.goto((html / path).as_uri())
    english = {s: w for s in browser_page.evaluate(_INTERFACE_JS) if (w := english_words(s))}
    assert not english, f"{path}: còn tiếng Anh trong giao diện: {english}"


@pytest.fixture
def device_page(html):
    """Open built pages offline in headless Chromium as a phone (390 × 844, touch) or a laptop
    (1366 × 768): ``open(path, phone)`` returns the page; no JavaScript error allowed."""
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)

        def _open(path: str, phone: bool):
            context = browser.new_context(
                offline=True, viewport={"width": 390, "height": 844} if phone else
                {"width": 1366, "height": 768}, has_touch=phone, is_mobile=phone)
            page = context.new_page()
            page.on("pageerror", lambda e: problems.append(f"JS error: {e}"))
            page.goto((html / path).as_uri())
            return page

        yield _open
        browser.close()
    assert problems == [], problems


def _visible(page, selector: str):
    loc = page.locator(selector)
    shown = [loc.nth(i) for i in range(loc.count()) if loc.nth(i).is_visible()]
    assert len(shown) == 1, f"{selector}: {len(shown)} nút hiện, cần đúng 1"
    return shown[0]


@NEEDS_CHROMIUM
def test_the_menu_buttons_open_the_contents_on_a_phone(device_page):
    page = device_page("book/ch04/p1/03-ddp.html", phone=True)
    dialog = page.locator("#pst-primary-sidebar-modal")
    _visible(page, ".primary-toggle").tap()
    page.wait_for_function("document.getElementById('pst-primary-sidebar-modal').open")
    link = dialog.get_by_role("link", name="4.1.5 Ring AllReduce", exact=False).first
    assert link.is_visible()
    page.keyboard.press("Escape")
    page.wait_for_function("!document.getElementById('pst-primary-sidebar-modal').open")
    # the contents went back to the sidebar, and the button opens them again
    assert page.locator("#pst-primary-sidebar a.reference").count() > 10
    _visible(page, ".primary-toggle").tap()
    page.wait_for_function("document.getElementById('pst-primary-sidebar-modal').open")
    link.tap()  # a tap on a page of the book goes there
    page.wait_for_url("**/05-ring-allreduce.html*")
    _visible(page, ".secondary-toggle").tap()
    page.wait_for_function("document.getElementById('pst-secondary-sidebar-modal').open")
    assert page.locator("#pst-secondary-sidebar-modal nav.page-toc").is_visible()


@NEEDS_CHROMIUM
def test_the_menu_button_hides_the_sidebar_on_a_desktop_and_one_search_box_shows(device_page):
    page = device_page("book/ch04/p1/03-ddp.html", phone=False)
    sidebar = page.locator("#pst-primary-sidebar")
    assert sidebar.is_visible()
    assert _visible(page, ".search-button-field").is_visible()  # exactly one search box
    toggle = _visible(page, ".primary-toggle")
    toggle.click()
    page.wait_for_timeout(400)  # the theme's 0.25 s transition
    assert not sidebar.is_visible() and not page.locator("#pst-primary-sidebar-modal").evaluate("d => d.open")
    _visible(page, ".search-button")  # search stays one click away
    toggle.click()
    page.wait_for_timeout(400)
    assert sidebar.is_visible()


@NEEDS_CHROMIUM
def test_every_page_fits_a_phone_and_its_formulas_render(device_page, html):
    wide, math_errors = {}, {}
    page = None
    for path in sorted(html.rglob("*.html")):
        rel = path.relative_to(html).as_posix()
        if rel.startswith(("_", "genindex")) or path.read_text("utf-8").startswith("<meta http-equiv"):
            continue  # the theme's pages, and the root's redirect to the first page
        if page is None:
            page = device_page(rel, phone=True)
        else:
            page.goto(path.as_uri())
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 390:
            wide[rel] = width
        # MathJax marks what it could not parse with <mjx-merror> ("Math input error")
        errors = page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise"
                               ".then(() => document.querySelectorAll('mjx-merror').length) : 0")
        if errors:
            math_errors[rel] = errors
    assert wide == {}, f"trang rộng hơn màn hình điện thoại 390 px: {wide}"
    assert math_errors == {}, f"công thức MathJax không dịch được (mjx-merror): {math_errors}"


def test_reading_load_is_within_the_budgets(html):
    """The chapter's budgets (DESIGN.md, issue 29), counted as a reader meets the built pages:
    words shown by default and in all, long sentences, long paragraphs."""
    from dpbook.tools import reading

    pages = reading.measure(html)
    assert len(pages) >= 30, [p.path for p in pages]
    shown, total = sum(p.shown for p in pages), sum(p.total for p in pages)
    long_sentences = [f"{p.path}: {s}" for p in pages for s in p.long_sentences]
    long_paragraphs = [f"{p.path}: {s}" for p in pages for s in p.long_paragraphs]
    table = reading.report(pages)
    assert shown <= reading.BUDGET["shown"], table
    assert total <= reading.BUDGET["all"], table
    assert len(long_sentences) <= reading.BUDGET["long_sentences"], "\n".join(long_sentences)
    assert not long_paragraphs, "\n".join(long_paragraphs)


def test_every_page_opens_with_its_reading_and_running_time(html):
    from dpbook.tools import reading

    for page in reading.chapter_pages(html):
        text = page.read_text(encoding="utf-8")
        stamp = re.search(r'<p class="dpbook-stamp">([^<]*)</p>', text)
        assert stamp, f"{page}: thiếu dòng thời gian đọc"
        words = reading.measure_html(reading.parsed(page)).shown
        assert stamp.group(1).startswith(reading.stamp(words, None)), (page, stamp.group(1))
        if (html / "_sources" / page.relative_to(html).with_suffix(".ipynb")).exists():
            assert "chạy các ô mã khoảng" in stamp.group(1), (page, stamp.group(1))


def test_prose_numbers_come_from_the_runs_or_cite_a_source(html):
    """Every number with a decimal comma or grouped thousands in the prose (shown or collapsed,
    maths included) is pasted from a run (myst-nb ``glue``) or stands in a block that cites its
    source (a bibliography entry or an external link)."""
    from dpbook.tools import reading

    found = [f"{page.relative_to(html)}: {n}" for page in reading.chapter_pages(html)
             for n in reading.unglued_numbers(reading.parsed(page))]
    assert not found, f"{len(found)} số trong lời văn không glue, không dẫn nguồn:\n" + \
        "\n".join(found[:80])
