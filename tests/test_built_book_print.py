"""The built book on paper and to take away: print (a filmstrip per animation), ``make pdf``
(``dpbook.tools.pdf``) and the executed notebooks to download (``dpbook.tools.downloads``)."""

import json
import pathlib
import re
import unicodedata
import zipfile
from urllib.parse import unquote

import pytest

from test_built_book import BROWSER_ARGS, CHROMIUM, NEEDS_CHROMIUM

pytestmark = [pytest.mark.slow, pytest.mark.builds_book]


def _download_links(page: pathlib.Path) -> dict[str, pathlib.Path]:
    """The download menu of a built page: label -> the file its link points to."""
    text = page.read_text(encoding="utf-8")
    links = {}
    for tag in re.findall(r"<a [^>]*btn-download-[^>]*>", text):
        label = re.search(r"btn-download-([a-z]+)-button", tag).group(1)
        href = re.search(r'href="([^"]+)"', tag).group(1)
        links[label] = (page.parent / unquote(href)).resolve()
    return links


def _outputs_text(nb: dict) -> str:
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "".join(parts)


def _toc_notebooks(root: pathlib.Path) -> list[str]:
    import yaml

    def walk(entries):
        for e in entries:
            if "file" in e:
                yield e["file"]
            yield from walk(e.get("sections", []))
            yield from walk(e.get("chapters", []))

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"], *walk(toc["parts"])]
    return [f for f in files if (root / f"{f}.ipynb").exists()]


def test_download_gives_the_notebook_as_built(html, root):
    """A page's download button gives its notebook with the outputs the page shows, and every
    page's menu has the chapter's archive: every notebook of the table of contents, executed,
    with the package and the set-up files that run them."""
    page = html / "book/ch04/moi-truong.html"
    links = _download_links(page)
    assert set(links) >= {"source", "archive"}, links
    nb = json.loads(links["source"].read_text(encoding="utf-8"))
    committed = json.loads((root / "book/ch04/moi-truong.ipynb").read_text(encoding="utf-8"))
    assert _outputs_text(committed) == ""  # committed without outputs ...
    shown = _outputs_text(nb)
    assert "Chế độ" in shown  # ... downloaded with the run the page shows
    assert [c["source"] for c in nb["cells"]] == [c["source"] for c in committed["cells"]]

    archive = links["archive"]
    assert archive == _download_links(html / "book/ch04/p2/bai-a-ddp.html")["archive"]
    expected = _toc_notebooks(root)
    assert len(expected) >= 20
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
        assert {f"{doc}.ipynb" for doc in expected} <= names
        assert {"pyproject.toml", "Makefile", "code/dpbook/launch.py",
                "code/dpbook/widgets/calculator/calc.js"} <= names, names
        assert not any("__pycache__" in n for n in names)
        for doc in expected:
            member = json.loads(zf.read(f"{doc}.ipynb"))
            assert _outputs_text(member), f"{doc}: notebook trong tệp nén không có kết quả"
            served = html / "_sources" / f"{doc}.ipynb"
            assert zf.read(f"{doc}.ipynb") == served.read_bytes(), doc


@NEEDS_CHROMIUM
def test_print_lays_an_animation_out_as_a_filmstrip(html):
    """Printed, a player shows every frame, each with its number and caption, and no controls;
    on screen it shows one frame."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_context(offline=True).new_page()
        page.goto((html / "book/widgets/ring-allreduce.html").as_uri())
        player = page.locator(".dpb-player").first
        frames = player.locator(".dpb-frame")
        n = frames.count()
        assert n == 7
        visible = frames.evaluate_all("fs => fs.filter(f => f.offsetParent !== null).length")
        assert visible == 1
        page.emulate_media(media="print")
        assert frames.evaluate_all("fs => fs.filter(f => f.offsetParent !== null).length") == n
        captions = player.locator(".dpb-frame .dpb-cap").all_inner_texts()
        assert len(captions) == n and captions[0].startswith("1 / 7.")
        assert any("Reduce-scatter, bước 2/3" in c for c in captions)
        assert not player.locator(".dpb-controls").is_visible()
        assert not player.locator(".dpb-caption").is_visible()
        browser.close()


def _pdf_text(path: pathlib.Path) -> str:
    from pypdf import PdfReader

    text = " ".join(page.extract_text() or "" for page in PdfReader(path).pages)
    # NFKC: the PDF's fonts set "offload" with the ligature ﬄ, which NFC leaves as it is
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _title(root: pathlib.Path, doc: str) -> str:
    """A page's title: its first level-1 heading, as a reader sees it (no Markdown marks)."""
    path = root / f"{doc}.ipynb"
    if path.exists():
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = (root / f"{doc}.md").read_text(encoding="utf-8")
    title = re.search(r"^# (.+)$", text, re.M).group(1)
    title = re.sub(r"[`*]", "", title)
    return " ".join(unicodedata.normalize("NFC", title).split())


# Printing all of it takes minutes on 2 cores (the whole book: 550 pages, about 90 s a print
# here under load); the test prints a theory page with formulas and animations, a page with
# exercises and solutions, and the glossary, through the same code path as `make pdf`.
PRINTED = ["book/ch04/p1/05-ring-allreduce", "book/ch04/p1/08-chon-ddp-hay-fsdp", "book/glossary"]


@NEEDS_CHROMIUM
def test_make_pdf_prints_the_book(root, tmp_path):
    """``make pdf``'s one-page book holds every page's title; its two printed editions: headings
    with their diacritics, formulas typeset (no TeX left), every frame of an animation, the
    solutions in one edition only. Built on its own, as `make pdf` on a fresh clone, alongside
    the HTML build of the other tests."""
    from conftest import book_config
    from dpbook.tools import pdf

    out = tmp_path / "book"
    index = pdf.build_single_html(root, book_config(root, out), out)
    assert index.parent.name == "singlehtml" and index.name == "index.html"
    one_page = " ".join(unicodedata.normalize("NFC", re.sub(r"<[^>]+>", " ", index.read_text(
        encoding="utf-8"))).split())
    for doc in _toc_notebooks(root) + ["book/ch04/p1/index", "book/glossary"]:
        assert _title(root, doc) in one_page, f"bản một trang thiếu trang {doc}"
    assert 'src="_static/mathjax/tex-chtml.js' in index.read_text(encoding="utf-8")

    printed = {p.solutions: p for p in pdf.print_pdfs(index, tmp_path / "pdf", PRINTED)}
    full, student = _pdf_text(printed[True].path), _pdf_text(printed[False].path)
    # only the pages asked for (the whole book prints to about 550 pages)
    assert 150 > printed[True].pages > printed[False].pages > 10
    for doc in PRINTED:
        title = unicodedata.normalize("NFKC", _title(root, doc))
        assert title in full, f"PDF thiếu tiêu đề {title!r}"
        assert title in student, f"bản cho người học thiếu tiêu đề {title!r}"
    assert "bộ nhớ đỉnh" in full.lower()
    for tex in ("\\frac", "\\begin{", "$$", "\\mathrm", "\\Psi"):
        assert tex not in full, f"công thức chưa được MathJax dựng: {tex}"
    # a frame the screen hides at first. Spaces aside: in the players' font Chromium places a
    # syllable's stacked marks as glyphs of their own, and the text read back splits it ("b ướ c")
    assert "Reduce-scatter,bước2/3" in full.replace(" ", "")
    # sphinx-exercise's title of a solution (the prose may say "lời giải cho" too)
    solution = re.compile(r"Lời giải cho Bài tập \d+")
    assert len(solution.findall(full)) >= 5 and not solution.findall(student)
    assert student.count("Bài tập") >= 5 and full.count("Bài tập") >= student.count("Bài tập")
