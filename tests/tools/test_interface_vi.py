"""The interface's strings in Vietnamese (the book-wide check is tests/test_built_book.py)."""

import json
from pathlib import Path

from dpbook.tools import interface_vi

ROOT = Path(__file__).resolve().parents[2]


def test_js_catalog_carries_the_search_page_strings():
    text = interface_vi.js_catalog(ROOT / interface_vi.CATALOG / "sphinx.po")
    data = json.loads(text.removeprefix("Documentation.addTranslations(").rstrip().removesuffix(");"))
    assert data["locale"] == "vi"
    for msgid in ("Searching", "Search Results", "Preparing search...", "Hide Search Matches"):
        assert data["messages"][msgid], msgid
    assert all(v for v in data["messages"].values())


def test_cell_prompts_lose_mysts_english_word():
    assert interface_vi.cell_prompt("Hiện source") == "Hiện mã"
    assert interface_vi.cell_prompt("Ẩn outputs") == "Ẩn kết quả"
    assert interface_vi.cell_prompt("Hiện") == "Hiện"


def test_labels_written_without_gettext_are_replaced():
    page = '<button title="Toggle primary sidebar"><nav aria-label="Main">Main</nav>'
    assert interface_vi.translate_labels(page) == (
        '<button title="Ẩn/hiện mục lục của sách"><nav aria-label="Mục lục của sách">Main</nav>')
