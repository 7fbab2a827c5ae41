"""``make pdf``: the whole book as one PDF, and a student edition without the solutions.

jupyter-book's ``pdfhtml`` builder prints through pyppeteer, which downloads its own Chromium: it
cannot work on a machine that reaches only PyPI and Debian. So the book is built once more with
Sphinx's ``singlehtml`` builder (the same execution cache and saved environment as ``make book``:
nothing runs twice), and Debian's Chromium prints that one page through Playwright. Before
printing, the page waits for MathJax to typeset every formula and opens every folded block (the
exercises' solutions are dropdowns, hidden cells are ``<details>``); in print, each animation is a
filmstrip of all its frames with their captions (``dpbook.widgets.player``).

The student edition is the same page with the solutions taken out before printing, which is
what sphinx-exercise's ``hide_solutions`` does to the document; a second Sphinx build with that
setting would read every page again for the same result.

    python -m dpbook.tools.pdf [--out DIR] [--pages PAGE ...] [--config FILE --path-output DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FULL, STUDENT = "chuong-4.pdf", "chuong-4-khong-loi-giai.pdf"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]
# Solutions as sphinx-exercise writes them (`solution` class on the admonition); the exercises
# themselves stay.
_DROP_SOLUTIONS = "() => { for (const s of document.querySelectorAll('div.solution')) s.remove(); }"
# Folded content opened for print: <details> (hidden cells, dropdowns) and the admonitions that
# sphinx-togglebutton folds (its own beforeprint handler does the same in a browser's print).
_OPEN_ALL = """() => {
  for (const d of document.querySelectorAll('details')) d.open = true;
  for (const a of document.querySelectorAll('.toggle-hidden')) a.classList.remove('toggle-hidden');
  for (const b of document.querySelectorAll('button.toggle-button')) b.remove();
}"""
_TYPESET = """() => Promise.race([MathJax.startup.promise, new Promise((_, fail) =>
  setTimeout(() => fail(new Error('MathJax chưa dựng xong công thức sau 120 s')), 120000))])"""
# Keeps only the named pages of the one-page book. Sphinx's singlehtml opens each page with
# <span id="document-PAGE"></span> followed by its content, and a page's subpages sit inside
# that content (in its toctree's place): so an element of a page not kept goes unless it holds
# a kept page, whose container is then pruned the same way.
_KEEP_PAGES = """(keep) => {
  const held = keep.map((k) => `span[id="document-${k}"]`).join(",");
  function prune(container) {
    let kept = false;
    for (const el of [...container.children]) {
      if (el.tagName === "SPAN" && el.id.startsWith("document-")) {
        kept = keep.includes(el.id.slice("document-".length));
      } else if (!kept) {
        if (el.querySelector(held)) prune(el); else el.remove();
      }
    }
  }
  prune(document.querySelector("article.bd-article") || document.body);
}"""
_FOOTER = ('<div style="font-size:8px;width:100%;text-align:center;color:#555">'
           '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')


@dataclass(frozen=True)
class Printed:
    path: Path
    pages: int
    solutions: bool


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise RuntimeError("make pdf cần Chromium (gói Debian `chromium`): chạy `make browser` "
                           "với quyền root, hoặc `apt-get install chromium`")
    return found


def build_single_html(root: Path = ROOT, config: Path | None = None,
                      path_output: Path | None = None) -> Path:
    """The book as one HTML page (under ``_build/singlehtml``), from the execution cache."""
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb), "build", str(root), "--builder", "singlehtml", "-W", "--keep-going"]
    if config is not None:
        cmd += ["--config", str(config)]
    if path_output is not None:
        cmd += ["--path-output", str(path_output)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env=os.environ | {"PYTHONWARNINGS": ""})
    if proc.returncode != 0:
        raise RuntimeError("dựng bản một trang (singlehtml) thất bại:\n"
                           + proc.stdout[-4000:] + proc.stderr[-2000:])
    folder = (path_output or root) / "_build" / "singlehtml"
    index = folder / "index.html"
    # jupyter-book writes the page under the root document's name (book/intro.html) and an
    # index.html that redirects to it, but Sphinx computes the page's links as if it sat at the
    # top (src="_static/…", href="book/intro.html#…"): from book/ none of them resolve. The page
    # goes to the top, and its links to itself become anchors, which the PDF keeps as links.
    redirect = re.search(r'url=([^"]+)"', index.read_text(encoding="utf-8"))
    if redirect:
        name = redirect.group(1)
        text = (folder / name).read_text(encoding="utf-8")
        index.write_text(text.replace(f'href="{name}#', 'href="#'), encoding="utf-8")
    return index


def print_pdfs(index: Path, out: Path, pages: list[str] | None = None) -> list[Printed]:
    """Both editions of ``index`` printed to ``out`` (A4, page numbers, outline from headings);
    ``pages`` (names such as ``book/ch04/p1/05-ring-allreduce``) keeps only those pages."""
    from playwright.sync_api import sync_playwright
    from pypdf import PdfReader

    out.mkdir(parents=True, exist_ok=True)
    done = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        page = browser.new_context(offline=True).new_page()
        page.goto(index.as_uri(), wait_until="load", timeout=300_000)
        page.wait_for_function("() => window.MathJax && MathJax.startup"
                               " && MathJax.startup.promise", timeout=60_000)
        # page.evaluate has no timeout of its own: the wait on MathJax gets one
        page.evaluate(_TYPESET)
        page.evaluate(_OPEN_ALL)
        if pages is not None:
            page.evaluate(_KEEP_PAGES, pages)
        # one load for both editions: the student edition is the same page less its solutions
        for name, solutions in ((FULL, True), (STUDENT, False)):
            if not solutions:
                page.evaluate(_DROP_SOLUTIONS)
            target = out / name
            page.pdf(path=str(target), format="A4", print_background=True, outline=True,
                     display_header_footer=True, header_template="<span></span>",
                     footer_template=_FOOTER,
                     margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"})
            done.append(Printed(target, len(PdfReader(target).pages), solutions))
        browser.close()
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpbook.tools.pdf",
                                     description="In cả cuốn sách ra một tệp PDF.")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "pdf",
                        help="thư mục ghi hai tệp PDF (mặc định: _build/pdf)")
    parser.add_argument("--pages", nargs="+", metavar="TRANG",
                        help="chỉ in những trang này (vd. book/ch04/p1/05-ring-allreduce)")
    parser.add_argument("--config", type=Path, help="tệp _config.yml khác (cho kiểm thử)")
    parser.add_argument("--path-output", type=Path, help="thư mục _build khác (cho kiểm thử)")
    args = parser.parse_args(argv)
    index = build_single_html(ROOT, args.config, args.path_output)
    for printed in print_pdfs(index, args.out, args.pages):
        kind = "có lời giải" if printed.solutions else "không có lời giải (cho người học)"
        print(f"{printed.path}: {printed.pages} trang, {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
