"""Executed notebooks to download (loaded by ``dpbook.tools.sphinx_ext``).

A page's download button (sphinx-book-theme's ``add_header_buttons``) links
``_sources/<page>.ipynb``, the copy Sphinx makes of the source: the notebook without its outputs,
as it is committed. The outputs a page shows come from the execution cache (myst-nb's
``NotebookClientCache`` merges the cached run into the notebook,
``myst_nb/core/execute/cache.py``); myst-nb's own copy under ``jupyter_execute`` is written from
the notebook before that merge (``myst_nb/sphinx_.py``, end of ``parse``) and has no outputs in
``cache`` mode. So once the build has finished, each notebook is merged with its cached run the
same way (``merge_match_into_notebook``) and replaces the copy under ``_sources``: the button
gives the notebook as built. Every notebook of the chapter, with the package that runs them,
goes into one archive (``ARCHIVE``), linked from every page's download menu.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from . import execution_cache

ARCHIVE = "_downloads/dpbook-chuong-4.zip"
# What a learner needs beside the notebooks to run them (`make lab`) and to build the book
# again (`make book`): the set-up files, the package, the book's other sources.
PROJECT_FILES = ("README.md", "Makefile", "pyproject.toml", "constraints.txt", "environment.yml",
                 "_config.yml", "_toc.yml")
FOLDERS = {Path("code", "dpbook"): (".py", ".js"), Path("book"): (".md", ".bib", ".css"),
           Path("locale"): (".po",)}
# A fixed time stamp: the same outputs give the same archive, byte for byte.
_STAMP = (2026, 1, 1, 0, 0, 0)


def notebook_pages(app) -> list[str]:
    """The pages whose source is a notebook, in the order of the table of contents."""
    env, order = app.env, []

    def walk(doc: str) -> None:
        if doc not in order:
            order.append(doc)
            for child in env.toctree_includes.get(doc, ()):
                walk(child)

    walk(app.config.root_doc)
    order += sorted(set(env.found_docs) - set(order))
    return [doc for doc in order if str(env.doc2path(doc)).endswith(".ipynb")]


def _member(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_STAMP)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def write_archive(path: Path, root: Path, notebooks: dict[str, Path]) -> None:
    """A zip of ``notebooks`` (page name -> executed file) and the files that run and build them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for doc, executed in notebooks.items():
            _member(zf, f"{doc}.ipynb", executed.read_bytes())
        for name in PROJECT_FILES:
            if (root / name).is_file():
                _member(zf, name, (root / name).read_bytes())
        for folder, suffixes in FOLDERS.items():
            for src in sorted((root / folder).rglob("*")):
                if src.is_file() and src.suffix in suffixes and "__pycache__" not in src.parts:
                    _member(zf, src.relative_to(root).as_posix(), src.read_bytes())


class NotExecuted(RuntimeError):
    """A notebook has no successful run in the execution cache."""


def executed(cache_path: Path, source: Path):
    """The notebook at ``source`` with the outputs of its run in the execution cache."""
    import nbformat
    from jupyter_cache import get_cache

    nb = nbformat.read(source, as_version=4)
    try:
        _, merged = get_cache(str(cache_path)).merge_match_into_notebook(nb)
    except KeyError:
        # Never serve the notebook without outputs under the "as built" label.
        raise NotExecuted(f"không có lần chạy nào của {source} trong bộ nhớ đệm "
                          f"{cache_path}") from None
    return merged


def failure(cache_path: Path, source: Path) -> str | None:
    """The end of the traceback jupyter-cache kept from the last failed run of ``source`` (the
    failing cell's error: myst-nb's cache mode stores it with ``NbProjectRecord.set_traceback``),
    or None if no run of it failed."""
    import re

    from jupyter_cache import get_cache

    for record in get_cache(str(cache_path)).list_project_records():
        if Path(record.uri).resolve() == source.resolve() and record.traceback:
            lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", record.traceback).splitlines()
                     if ln.strip()]
            return "\n".join(lines[-3:])
    return None


def _publish(app, exception) -> None:
    if exception is not None or app.builder.name != "html":
        return
    import nbformat

    out, cache_path, found = Path(app.outdir), execution_cache.cache_folder(app), {}
    missing = []
    for doc in notebook_pages(app):
        source = Path(app.env.doc2path(doc))
        try:
            nb = executed(cache_path, source)
        except NotExecuted:
            missing.append(source)
            continue
        target = out / "_sources" / f"{doc}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        found[doc] = target
    if missing:
        raise NotExecuted(_missing_message(cache_path, Path(app.srcdir), out, missing))
    write_archive(out / ARCHIVE, Path(app.srcdir), found)


def _missing_message(cache_path: Path, srcdir: Path, out: Path, missing: list[Path]) -> str:
    parts = [f"{len(missing)} notebook không chạy trọn khi dựng sách, nên không có bản đã chạy "
             "để tải xuống:"]
    for source in missing:
        rel = source.relative_to(srcdir) if source.is_relative_to(srcdir) else source
        error = failure(cache_path, source)
        report = out / "reports" / rel.with_suffix(".err.log")
        parts.append(f"- {rel}: " + (f"ô mã lỗi:\n    " + error.replace("\n", "\n    ")
                                     if error else "chưa chạy (không có lần chạy lỗi nào được ghi)"))
        if report.exists():
            parts.append(f"    (toàn bộ traceback: {report})")
    parts.append("Sửa ô lỗi rồi dựng lại (make book); chạy riêng một notebook: .venv/bin/python "
                 "-m pytest --nbval-lax ĐƯỜNG_DẪN.ipynb")
    return "\n".join(parts)


def _archive_button(app, pagename, templatename, context, doctree) -> None:
    """The download menu the theme has just built for this page: its notebook is now the
    executed one, and the archive joins it."""
    for group in context.get("header_buttons") or []:
        if group.get("label") == "download-buttons":
            for button in group["buttons"]:
                if str(button.get("url", "")).endswith(".ipynb"):
                    button["tooltip"] = "Tải xuống notebook đã chạy (có kết quả)"
            group["buttons"].append({
                "type": "link",
                "url": context["pathto"](ARCHIVE, 1),
                "text": ".zip",
                "tooltip": "Tải xuống mọi notebook của chương (đã chạy) kèm gói dpbook",
                "icon": "fas fa-file-archive",
                "label": "download-archive-button",
            })


def setup(app) -> None:
    app.connect("build-finished", _publish)
    # after sphinx-book-theme's add_header_buttons (priority 501), which builds the menu
    app.connect("html-page-context", _archive_button, priority=600)
