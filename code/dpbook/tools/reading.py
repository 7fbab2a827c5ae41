"""The reader's load, counted on the built book: words shown by default and in all, reading time,
long sentences and long paragraphs, per page and in total.

``python -m dpbook.tools.reading [_build/html] [-v] [-n]`` prints the table (``-v``: the long
sentences and paragraphs; ``-n``: the prose numbers neither glued from a run nor cited); the build puts each page's
reading and running time at its top (``stamp``), and ``tests/test_built_book.py`` holds the
chapter to the budgets of ``../shared/DESIGN.md`` (``BUDGET``).

What counts as a word: a whitespace-separated token of the article's text (a Vietnamese
syllable, an inline formula or inline code counts as one), as the editor's review counted. Not
counted: code cells and their outputs, literal blocks, display maths, the page's own stamp.
Hidden by default: what sits in a collapsed block (``<details>`` without ``open``, a
``dropdown`` admonition, an exercise's solution), except the block's title, which shows.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bs4 import BeautifulSoup, NavigableString, Tag

WORDS_PER_MINUTE = 150  # the editor's review's reading speed for technical Vietnamese
# The chapter's budgets (DESIGN.md, "Budgets"; issue 29).
BUDGET = {"shown": 45_000, "all": 95_000, "long_sentences": 20, "paragraph": 150}
LONG_SENTENCE = 60

# A bibliography entry (``citation-list``) is a reference, not prose.
_SKIP = ("cell_input", "cell_output", "highlight", "math", "dpbook-stamp", "headerlink",
         "toggle-button", "sd-summary-up", "sd-summary-down", "citation-list")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+(?=[\"“(]?[A-ZĐÀ-Ỹ0-9`])")


@dataclass
class Page:
    path: str
    shown: int = 0
    hidden: int = 0
    long_sentences: list[str] = field(default_factory=list)
    long_paragraphs: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.shown + self.hidden

    @property
    def minutes(self) -> int:
        return max(1, round(self.shown / WORDS_PER_MINUTE))


def _skipped(tag: Tag) -> bool:
    if tag.name in ("script", "style", "pre", "button"):
        return True
    classes = tag.get("class") or []
    return any(c in _SKIP for c in classes)


def _collapsed(tag: Tag) -> bool:
    """Content hidden until the reader opens it (the title of the block stays visible)."""
    if tag.name == "details" and not tag.has_attr("open"):
        return True
    classes = tag.get("class") or []
    return "dropdown" in classes or "toggle-hidden" in classes


def _is_title(tag: Tag) -> bool:
    classes = tag.get("class") or []
    return tag.name == "summary" or "admonition-title" in classes


def _walk(node: Tag, hidden: bool, counts: list[int]) -> None:
    for child in node.children:
        if isinstance(child, NavigableString):
            if child.__class__.__name__ in ("Comment", "Doctype"):
                continue
            counts[hidden] += len(child.split())
        elif isinstance(child, Tag) and not _skipped(child):
            if _collapsed(child):
                for part in child.children:
                    if isinstance(part, Tag) and _is_title(part):
                        _walk(part, hidden, counts)
                    elif isinstance(part, Tag) and not _skipped(part):
                        _walk(part, True, counts)
                    elif isinstance(part, NavigableString):
                        counts[True] += len(part.split())
            else:
                _walk(child, hidden, counts)


def _shown_text(tag: Tag) -> str:
    parts: list[str] = []

    def walk(node: Tag) -> None:
        for child in node.children:
            if isinstance(child, NavigableString):
                parts.append(str(child))
            elif isinstance(child, Tag) and not _skipped(child) and not _collapsed(child):
                walk(child)

    walk(tag)
    return " ".join(" ".join(parts).split())


def _inside_collapsed(tag: Tag, root: Tag) -> bool:
    for parent in tag.parents:
        if parent is root:
            return False
        if _collapsed(parent) or _skipped(parent):
            return True
    return False


def article(html: str) -> Tag:
    """The page's article in a whole built page, or the fragment itself (a page's body while
    it is being written). Only the article's own text is parsed: the navigation around it is
    most of a built page, and parsing it tripled the time."""
    start = html.find('<article class="bd-article"')
    end = html.rfind("</article>")
    if start >= 0 and end > start:
        html = html[start:end + len("</article>")]
    soup = BeautifulSoup(html, "html.parser")
    return soup.find("article", class_="bd-article") or soup


@functools.lru_cache(maxsize=128)
def _parsed(path: str, mtime_ns: int) -> Tag:
    return article(Path(path).read_text(encoding="utf-8"))


def parsed(path: Path) -> Tag:
    """A built page's article, parsed once per version of the file (the tests read every page
    three times; parsing is nearly all of their time)."""
    return _parsed(str(path), path.stat().st_mtime_ns)


def measure_html(html: "str | Tag", path: str = "") -> Page:
    page = Page(path)
    root = article(html) if isinstance(html, str) else html
    counts = [0, 0]
    _walk(root, False, counts)
    page.shown, page.hidden = counts
    for p in root.find_all(["p", "li"]):
        if p.name == "li" and p.find("p"):
            continue  # its paragraphs are counted one by one
        if _inside_collapsed(p, root) or p.find_parent("table"):
            continue
        text = _shown_text(p)
        if len(text.split()) > BUDGET["paragraph"]:
            page.long_paragraphs.append(text[:80] + "…")
        for sentence in _SENTENCE_END.split(text):
            if len(sentence.split()) > LONG_SENTENCE:
                page.long_sentences.append(sentence[:80] + "…")
    return page


# A number a reader takes for a result: a decimal comma (``1,5``) or grouped thousands
# (``11 728``, any space), in prose or in maths (``10{,}5``, ``11\,728``).
_NUMBER = re.compile(r"\d+(?:,|\{,\})\d+|\d{1,3}(?:(?:[ \u00a0\u202f\u2009]|\\,)\d{3})+(?!\d)")
_BLOCKS = ("p", "li", "td", "th", "dt", "dd", "h1", "h2", "h3", "h4", "caption", "figcaption")
_NOT_PROSE = ("cell_input", "cell_output", "highlight", "pasted-text", "dpbook-stamp",
              "citation-list")


def _cited(block: Tag) -> bool:
    """The block names its source: a bibliography citation or an external link."""
    for a in block.find_all("a", href=True):
        classes = a.get("class") or []
        if "external" in classes or "references.html#" in a["href"]:
            return True
    return False


def unglued_numbers(html: "str | Tag") -> list[str]:
    """Numbers in the page's prose (shown or collapsed) that are neither pasted from a run
    (myst-nb's ``glue``: ``span.pasted-text``) nor in a block that cites its source."""
    root = article(html) if isinstance(html, str) else html
    found = []
    for block in root.find_all(_BLOCKS):
        if block.find(_BLOCKS):
            continue  # the innermost blocks carry the text
        if any(any(c in _NOT_PROSE for c in (p.get("class") or [])) or p.name == "pre"
               for p in block.parents if isinstance(p, Tag)):
            continue
        parts = []
        for text in block.find_all(string=True):
            if any(any(c in _NOT_PROSE for c in (p.get("class") or [])) for p in text.parents
                   if isinstance(p, Tag) and p is not block.parent):
                continue
            parts.append(str(text))
        text = " ".join("".join(parts).split())
        numbers = _NUMBER.findall(text)
        if numbers and not _cited(block):
            found += [f"{n} | {text[:100]}" for n in numbers]
    return found


def chapter_pages(html_dir: Path) -> list[Path]:
    """The book's pages in the built HTML, in the order of the table of contents' files."""
    return sorted(p for p in html_dir.rglob("*.html")
                  if "book" in p.relative_to(html_dir).parts
                  and not p.name.startswith(("genindex", "search", "_")))


def measure(html_dir: Path) -> list[Page]:
    return [measure_html(parsed(p), str(p.relative_to(html_dir))) for p in chapter_pages(html_dir)]


def stamp(words_shown: int, runtime_s: float | None) -> str:
    """The line each page opens with: reading time, and the running time of its cells."""
    text = f"Đọc khoảng {max(1, round(words_shown / WORDS_PER_MINUTE))} phút"
    if runtime_s is not None:
        text += (f" · chạy các ô mã khoảng {max(1, round(runtime_s))} giây trên máy của sách "
                 "(2 lõi CPU)")
    return text


def report(pages: list[Page]) -> str:
    from .. import vi

    rows = [f"{'trang':<48} {'hiện':>7} {'tất cả':>7} {'phút':>5} {'câu>60':>7} {'đoạn>150':>9}"]
    for p in pages:
        rows.append(f"{p.path:<48} {vi.grouped(p.shown, ' '):>7} {vi.grouped(p.total, ' '):>7} "
                    f"{p.minutes:>5} {len(p.long_sentences):>7} {len(p.long_paragraphs):>9}")
    shown = sum(p.shown for p in pages)
    total = sum(p.total for p in pages)
    long_s = sum(len(p.long_sentences) for p in pages)
    long_p = sum(len(p.long_paragraphs) for p in pages)
    rows.append(f"{'tổng':<48} {vi.grouped(shown, ' '):>7} {vi.grouped(total, ' '):>7} "
                f"{round(shown / WORDS_PER_MINUTE):>5} {long_s:>7} {long_p:>9}")
    rows.append(f"ngân sách: hiện ≤ {vi.grouped(BUDGET['shown'], ' ')}, tất cả ≤ "
                f"{vi.grouped(BUDGET['all'], ' ')}, câu > {LONG_SENTENCE} từ ≤ "
                f"{BUDGET['long_sentences']}, không đoạn nào > {BUDGET['paragraph']} từ")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [a for a in args if not a.startswith("-")]
    html_dir = Path(paths[0] if paths else "_build/html")
    if not html_dir.is_dir():
        print(f"Không thấy thư mục {html_dir}: dựng sách trước (make book), hoặc chỉ đường dẫn "
              "tới thư mục html đã dựng.", file=sys.stderr)
        return 2
    pages = measure(html_dir)
    print(report(pages))
    if "-n" in args:
        for p in chapter_pages(html_dir):
            for n in unglued_numbers(parsed(p)):
                print(f"{p.relative_to(html_dir)}: số chưa glue, chưa dẫn nguồn: {n}")
    if "-v" in args:
        for p in pages:
            for s in p.long_sentences:
                print(f"{p.path}: câu dài: {s}")
            for s in p.long_paragraphs:
                print(f"{p.path}: đoạn dài: {s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
