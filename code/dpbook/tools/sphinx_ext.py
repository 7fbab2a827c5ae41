"""Sphinx fixes for the built book (loaded from ``_config.yml``).

No stale numbers: jupyter-cache keys a notebook's outputs on its code cells only, and Sphinx
re-reads only pages whose source changed; a change in the package the pages import (or in the
pinned torch) would leave old outputs in the book. The files named by the config value
``dpbook_execution_inputs`` are hashed (``dpbook.tools.execution_cache``); when the hash differs
from the one the execution cache, or Sphinx's saved environment, was made for, that one is
dropped, so every notebook runs again and every page is read again.

sphinx-thebe 0.3 adds its configuration script with ``app.add_js_file`` while documents are
being read; Sphinx 7 then registers it both in the registry and in the builder, so every page
declares ``const THEBE_JS_URL`` twice and the browser logs a SyntaxError. Dropping repeated
script entries per page removes the error without touching either package.

Search in Vietnamese (diacritics folded, glossary aliases) comes from ``dpbook.tools.search_vi``,
the interface's strings in Vietnamese from ``dpbook.tools.interface_vi``, the executed notebooks
to download from ``dpbook.tools.downloads``, each page's reading and running time at its top from
``dpbook.tools.reading``.
"""

from __future__ import annotations

from pathlib import Path

from . import downloads, execution_cache, interface_vi, reading, search_vi


def _drop_stale_outputs(app, config) -> None:
    inputs = config.dpbook_execution_inputs
    if not inputs:
        return
    app.dpbook_digest = execution_cache.inputs_digest(Path(app.srcdir), inputs)
    execution_cache.ensure_valid(execution_cache.cache_folder(app), app.dpbook_digest)
    # Sphinx re-reads only pages whose source changed: its saved environment goes too.
    if not execution_cache.is_valid(app.doctreedir, app.dpbook_digest):
        Path(app.doctreedir, "environment.pickle").unlink(missing_ok=True)


def _record_inputs(app, exception) -> None:
    digest = getattr(app, "dpbook_digest", None)
    if exception is None and digest:
        execution_cache.stamp(app.doctreedir, digest)


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        # The two copies differ only in filename None versus "" (both mean an inline script).
        key = (getattr(js, "filename", None) or "",
               tuple(sorted(getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def _stamp_reading_time(app, pagename, templatename, context, doctree) -> None:
    """Each page of the chapter opens with its reading time (words shown by default, counted as
    ``dpbook.tools.reading`` counts them) and, for a notebook, the time its cells took to run
    when the book was built (myst-nb's execution record)."""
    body = context.get("body")
    if not body or not pagename.startswith("book/") or "<h1" not in body:
        return
    from myst_nb.sphinx_ import NbMetadataCollector

    try:
        exec_data = NbMetadataCollector.get_exec_data(app.env, pagename)
    except KeyError:
        exec_data = None
    runtime = exec_data.get("runtime") if exec_data else None
    shown = reading.measure_html(body).shown
    line = f'<p class="dpbook-stamp">{reading.stamp(shown, runtime)}</p>'
    end = body.index("</h1>") + len("</h1>")
    context["body"] = body[:end] + line + body[end:]


def _html_handlers_for_singlehtml(app) -> None:
    # Sphinx takes a node's handlers from the builder's name and falls back to its format only
    # when no extension registered any for that name (``SphinxComponentRegistry.create_translator``).
    # sphinx-exercise registers ``singlehtml=`` handlers, so myst-nb's ``HideCodeCellNode``
    # (registered for ``html`` only) had none in the one-page build that ``make pdf`` prints.
    if app.builder.name != "singlehtml":
        return
    handlers = app.registry.translation_handlers
    for node, visit_depart in handlers.get("html", {}).items():
        handlers.setdefault("singlehtml", {}).setdefault(node, visit_depart)


def setup(app):
    app.add_config_value("dpbook_execution_inputs", [], "env")
    app.connect("config-inited", _drop_stale_outputs)
    app.connect("build-finished", _record_inputs)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    app.connect("html-page-context", _stamp_reading_time)
    app.connect("builder-inited", _html_handlers_for_singlehtml)
    search_vi.setup(app)
    interface_vi.setup(app)
    downloads.setup(app)
    # env_version: the saved environment of a build before the glossary aliases lacks them.
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
