"""The book's rules: NFC text, notebooks without outputs, every page in the TOC, a clean build."""

import json
import os
import pathlib
import re
import subprocess
import sys
import unicodedata

import pytest
import yaml

BOOK_SUFFIXES = {".md", ".ipynb", ".bib", ".yml"}


def _book_files(root):
    files = [p for p in (root / "book").rglob("*") if p.suffix in BOOK_SUFFIXES and p.is_file()]
    return files + [root / "_config.yml", root / "_toc.yml"]


def test_text_is_nfc_utf8_without_cjk(root):
    for path in _book_files(root):
        text = path.read_bytes().decode("utf-8")  # raises if not UTF-8
        assert unicodedata.is_normalized("NFC", text), f"{path} không ở dạng Unicode NFC"
        assert not re.search(r"[\u4e00-\u9fff]", text), f"{path} chứa ký tự CJK"


def test_notebooks_are_committed_without_outputs(root):
    for nb in (root / "book").rglob("*.ipynb"):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        for cell in cells:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and cell.get("execution_count") is None, nb


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


@pytest.mark.slow
def test_book_builds_without_warnings(root, tmp_path):
    """``jupyter-book build -W`` with execution off (nbval executes the notebooks)."""
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    config["bibtex_bibfiles"] = [str(root / b) for b in config["bibtex_bibfiles"]]
    cfg = tmp_path / "_config.yml"
    cfg.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    jb = pathlib.Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", str(root), "-W", "--keep-going", "--config", str(cfg),
         "--path-output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, env=os.environ | {"PYTHONWARNINGS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    html = tmp_path / "out" / "_build" / "html"
    assert (html / "index.html").exists()
    for page in ("book/intro", "book/ch04/index", "book/ch04/moi-truong", "book/glossary"):
        assert (html / f"{page}.html").exists(), page
