"""The book's page sources as the tests read them, in one place: the pages under ``book/``
(JupyterLab's checkpoints left out), a notebook's cells, a page's prose."""

from __future__ import annotations

import json
import pathlib
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGE_SUFFIXES = (".md", ".ipynb")


class Cell(NamedTuple):
    index: int  # its place in the notebook, cells of every kind counted
    kind: str  # "code", "markdown" or "raw"
    source: str
    tags: tuple[str, ...]
    stored: dict  # the cell as the .ipynb stores it (outputs, execution_count…)


def pages(suffixes: tuple[str, ...] = PAGE_SUFFIXES) -> list[pathlib.Path]:
    """Every page source under ``book/`` whose suffix is one of ``suffixes``, in path order."""
    return sorted(p for p in BOOK.rglob("*") if p.suffix in suffixes and p.is_file()
                  and ".ipynb_checkpoints" not in p.parts)


def cells(notebook: pathlib.Path, kind: str | None = None) -> list[Cell]:
    """The cells of ``notebook`` (of ``kind`` only, if given), in order."""
    stored = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [Cell(i, c["cell_type"], "".join(c["source"]),
                 tuple(c.get("metadata", {}).get("tags", [])), c)
            for i, c in enumerate(stored) if kind is None or c["cell_type"] == kind]


def markdown(page: pathlib.Path) -> str:
    """A page's prose source: a .md file whole, a notebook's markdown cells joined."""
    if page.suffix == ".md":
        return page.read_text(encoding="utf-8")
    return "\n\n".join(c.source for c in cells(page, "markdown"))
