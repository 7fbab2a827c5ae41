"""The book's interface in Vietnamese (loaded by ``dpbook.tools.sphinx_ext``).

Three kinds of English reach a built page, and each gets its own fix:

- strings the themes pass through gettext (``_()`` in pydata-sphinx-theme's templates, Sphinx's
  own): Sphinx's Vietnamese catalogue leaves many empty and pydata-sphinx-theme has none, so the
  book carries ``locale/vi/LC_MESSAGES/sphinx.po``, read through ``locale_dirs`` (Sphinx itself
  compiles it to ``sphinx.mo``). The search page's strings are translated in the browser from
  ``sphinx.js`` (``StandaloneHTMLBuilder._get_translations_js`` takes the first one found in
  ``locale_dirs``), written here from the same ``.po``;
- myst-nb's prompts of hidden cells: ``nb_code_prompt_show`` in ``_config.yml`` says "Hiện
  {type}", and ``HideInputCells`` (``myst_nb/sphinx_.py``) puts an English word for ``{type}``
  ("source", "output"…), which ``TranslateCellPrompts`` turns into Vietnamese;
- labels written into templates and scripts without gettext (``title="Toggle primary sidebar"``
  in sphinx-book-theme's ``components/toggle-primary-sidebar.html``, ``aria-label="Main"``,
  ``"Toggle hidden content"`` in sphinx-togglebutton's script): ``LABELS`` replaces them in the
  written pages and scripts once the build has finished.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from babel.messages.pofile import read_po
from sphinx.transforms.post_transforms import SphinxPostTransform

CATALOG = Path("locale", "vi", "LC_MESSAGES")

# myst-nb's words for what a hidden cell's button shows or hides.
CELL_PARTS = {"content": "ô mã", "source": "mã", "output": "kết quả", "outputs": "kết quả"}

# Labels that the themes write without gettext: attribute value in English -> Vietnamese.
LABELS = {
    "Toggle primary sidebar": "Ẩn/hiện mục lục của sách",
    "Toggle secondary sidebar": "Ẩn/hiện mục lục của trang",
    "Main": "Mục lục của sách",
    "Page": "Trang",
    "Toggle hidden content": "Ẩn/hiện nội dung",
    "Fullscreen mode": "Chế độ toàn màn hình",
    "Download this page": "Tải xuống trang này",
    "Copy": "Sao chép",
    "Copied!": "Đã sao chép!",
    "Copy to clipboard": "Sao chép",
    "Search this book...": "Tìm trong sách…",  # jupyter-book's search_bar_text
}
_ATTRIBUTE = re.compile(r'((?:aria-label|title|placeholder|data-bs-title|data-tooltip)=")([^"]*)(")')


def js_catalog(po: Path) -> str:
    """The ``.po`` file as Sphinx's browser catalogue (``Documentation.addTranslations``)."""
    with open(po, "rb") as f:
        catalog = read_po(f)
    messages = {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}
    data = {"locale": str(catalog.locale or "vi"), "messages": messages, "plural_expr": "0"}
    return f"Documentation.addTranslations({json.dumps(data, ensure_ascii=False, indent=4)});\n"


def _write_js_catalog(app) -> None:
    po = Path(app.srcdir, CATALOG, "sphinx.po")
    if app.config.language != "vi" or not po.is_file():
        return
    js = po.with_suffix(".js")
    text = js_catalog(po)
    if not js.is_file() or js.read_text(encoding="utf-8") != text:
        js.write_text(text, encoding="utf-8")


def cell_prompt(prompt: str) -> str:
    """A hidden cell's prompt with myst-nb's English word at its end in Vietnamese."""
    head, _, last = prompt.rpartition(" ")
    return f"{head} {CELL_PARTS[last]}" if head and last in CELL_PARTS else prompt


class TranslateCellPrompts(SphinxPostTransform):
    """After myst-nb's ``HideInputCells`` (priority 199) has filled in ``{type}``."""

    default_priority = 200
    formats = ("html",)

    def run(self, **kwargs) -> None:
        for node in self.document.findall(lambda n: "prompt_show" in getattr(n, "attributes", {})):
            for key in ("prompt_show", "prompt_hide"):
                node[key] = cell_prompt(node[key])


def translate_labels(text: str) -> str:
    """``text`` (a written page or script) with every label of ``LABELS`` in Vietnamese."""
    def one(match):
        value = LABELS.get(match.group(2), match.group(2))
        return match.group(1) + value + match.group(3)
    return _ATTRIBUTE.sub(one, text)


def _translate_written(app, exception) -> None:
    if exception is not None or app.builder.format != "html" or app.config.language != "vi":
        return
    out = Path(app.outdir)
    for path in [*out.rglob("*.html"), *(out / "_static").glob("*.js")]:
        text = path.read_text(encoding="utf-8")
        new = translate_labels(text)
        if new != text:
            path.write_text(new, encoding="utf-8")


def setup(app) -> None:
    app.add_post_transform(TranslateCellPrompts)
    app.connect("builder-inited", _write_js_catalog)
    app.connect("build-finished", _translate_written)
