"""Sphinx fixes for the built book (loaded from ``_config.yml``).

sphinx-thebe 0.3 adds its configuration script with ``app.add_js_file`` while documents are
being read; Sphinx 7 then registers it both in the registry and in the builder, so every page
declares ``const THEBE_JS_URL`` twice and the browser logs a SyntaxError. Dropping repeated
script entries per page removes the error without touching either package.
"""

from __future__ import annotations


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


def setup(app):
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
