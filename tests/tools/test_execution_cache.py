"""The book's execution cache: notebook tests fill it, the book build uses it, and a change in
what the notebooks import (not in their cells) re-executes them: no stale numbers."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from dpbook.tools import execution_cache

pytestmark = pytest.mark.slow

NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# Trang thử"},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": "import mymod\nprint('GIA TRI', mymod.VALUE)"},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def test_digest_follows_the_files_and_ignores_bytecode(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1")
    (tmp_path / "pin.txt").write_text("torch==2.13.0")
    before = execution_cache.inputs_digest(tmp_path, ["pkg", "pin.txt"])
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert execution_cache.inputs_digest(tmp_path, ["pkg", "pin.txt"]) == before
    (tmp_path / "pin.txt").write_text("torch==2.14.0")
    assert execution_cache.inputs_digest(tmp_path, ["pkg", "pin.txt"]) != before


def test_an_invalid_cache_is_emptied_once(tmp_path):
    cache = tmp_path / "cache"
    assert execution_cache.ensure_valid(cache, "a")  # new: stamped
    (cache / "global.db").write_text("old outputs")
    assert not execution_cache.ensure_valid(cache, "a")
    assert (cache / "global.db").exists()
    assert execution_cache.ensure_valid(cache, "b")
    assert sorted(p.name for p in cache.iterdir()) == [execution_cache.STAMP]


def _project(tmp_path, value):
    root = tmp_path / "sach"
    root.mkdir(exist_ok=True)
    (root / "mymod.py").write_text(f"VALUE = {value!r}\n")
    (root / "trang.ipynb").write_text(json.dumps(NOTEBOOK, ensure_ascii=False))
    (root / "_toc.yml").write_text("format: jb-book\nroot: trang\n")
    (root / "pytest.ini").write_text("[pytest]\n")
    config = {"title": "thử", "only_build_toc_files": True,
              "exclude_patterns": [".*", "**/.*", "_build"],
              "execute": {"execute_notebooks": "cache", "timeout": 120},
              "sphinx": {"extra_extensions": ["dpbook.tools.sphinx_ext"],
                         "config": {"dpbook_execution_inputs": ["mymod.py"]}}}
    (root / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True))
    return root


def _env(root):
    return os.environ | {"PYTHONPATH": str(root), "PYTHONWARNINGS": ""}


def _build(root):
    jb = pathlib.Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(root), "-W", "-v"], capture_output=True,
                          text=True, timeout=300, env=_env(root))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    html = (root / "_build" / "html" / "trang.html").read_text(encoding="utf-8")
    return html, proc.stdout


def test_nbval_fills_the_cache_and_a_package_change_reruns_the_book(tmp_path):
    root = _project(tmp_path, "một")
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--nbval-lax", "-p", "dpbook.tools.nbval_cache",
         "-c", str(root / "pytest.ini"), "--rootdir", str(root), str(root / "trang.ipynb")],
        capture_output=True, text=True, timeout=300, env=_env(root), cwd=root)
    assert tests.returncode == 0, tests.stdout[-3000:]
    html, log = _build(root)
    assert "GIA TRI một" in html
    assert "Using cached notebook" in log and "Executing notebook" not in log  # nbval's run

    (root / "mymod.py").write_text("VALUE = 'hai'\n")  # the cells did not change
    html, log = _build(root)
    assert "GIA TRI hai" in html and "GIA TRI một" not in html
    assert "Executing notebook" in log

    html, log = _build(root)  # nothing changed: nothing runs again
    assert "GIA TRI hai" in html and "Executing notebook" not in log


def test_a_failed_notebook_is_named_with_its_cell_s_error_when_the_book_is_built(tmp_path):
    root = _project(tmp_path, "một")
    (root / "mymod.py").write_text("VALUE = 'một'\nassert VALUE == 'hai', 'giá trị sai: một'\n")
    jb = pathlib.Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(root), "-W", "--keep-going"],
                          capture_output=True, text=True, timeout=300, env=_env(root))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # the downloads step names the notebook, the failing cell's error and the full report
    assert "1 notebook không chạy trọn khi dựng sách" in out
    assert "- trang.ipynb: ô mã lỗi:" in out and "AssertionError: giá trị sai: một" in out
    assert "reports/trang.err.log" in out
