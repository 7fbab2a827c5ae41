"""The book's rules: NFC text, notebooks without outputs, every page in the TOC."""

import pathlib
import re
import unicodedata

import yaml

import book_sources

BOOK_SUFFIXES = (".md", ".ipynb", ".bib", ".yml")


def _book_files(root):
    return book_sources.pages(BOOK_SUFFIXES) + [root / "_config.yml", root / "_toc.yml"]


def test_text_is_nfc_utf8_without_cjk(root):
    for path in _book_files(root):
        text = path.read_bytes().decode("utf-8")  # raises if not UTF-8
        assert unicodedata.is_normalized("NFC", text), f"{path} không ở dạng Unicode NFC"
        assert not re.search(r"[\u4e00-\u9fff]", text), f"{path} chứa ký tự CJK"


def test_no_control_character_in_a_page_source(root):
    """A control character in a source is almost always an escape gone wrong: "\\approx" written
    as "\approx" in a Python string became BEL + "pprox", a MathJax error on the page."""
    for path in _book_files(root):
        if path.suffix == ".ipynb":
            texts = [c.source for c in book_sources.cells(path)]
        else:
            texts = [path.read_text("utf-8")]
        for text in texts:
            bad = re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", text)
            assert bad is None, (f"{path}: ký tự điều khiển {bad.group()!r} trong "
                                 f"{text[max(0, bad.start() - 30):bad.end() + 30]!r}")


def test_notebooks_are_committed_without_outputs(root):
    for nb in book_sources.pages((".ipynb",)):
        for cell in book_sources.cells(nb, "code"):
            assert not cell.stored.get("outputs") and cell.stored.get("execution_count") is None, nb


def _toc_files(node):
    if isinstance(node, dict):
        if "file" in node:
            yield node["file"]
        for v in node.values():
            yield from _toc_files(v)
    elif isinstance(node, list):
        for v in node:
            yield from _toc_files(v)


def test_every_page_is_in_the_toc_and_exists(root):
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    listed = {toc["root"], *_toc_files(toc)}
    pages = {str(p.relative_to(root).with_suffix("")) for p in (root / "book").rglob("*")
             if p.suffix in {".md", ".ipynb"} and ".ipynb_checkpoints" not in p.parts}
    assert listed == pages


def test_the_build_ignores_every_non_page(root, tmp_path):
    """What ``make test`` and the tools leave in the checkout (.pytest_cache/README.md,
    notebook checkpoints, benchmark notes) must not become pages: ``make book`` after
    ``make test`` would fail with -W. Sphinx's own file discovery, with the book's exclude
    patterns, must find the pages of the TOC and nothing else."""
    from sphinx.util.matching import get_matching_files

    config = yaml.safe_load((root / "_config.yml").read_text())
    patterns = config["exclude_patterns"]
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages = {toc["root"], *_toc_files(toc)}

    def sources(where):
        return {str(pathlib.PurePath(f).with_suffix("")) for f in
                get_matching_files(where, include_patterns=["**"], exclude_patterns=patterns)
                if pathlib.PurePath(f).suffix in {".md", ".ipynb"}}

    assert sources(root) == pages
    left_by_tools = [".pytest_cache/README.md", "book/.ipynb_checkpoints/x-checkpoint.ipynb",
                     ".jupyter_cache/x.md", "benchmarks/README.md", "_build/html/x.md",
                     ".venv/lib/LICENSE.md", "code/dpbook/README.md", "tests/data/x.ipynb"]
    for rel in left_by_tools:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("# x\n")
    assert sources(tmp_path) == set()
