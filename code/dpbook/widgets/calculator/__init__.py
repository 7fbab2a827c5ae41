"""Calculators that compute in the page, offline: the VRAM ledger per GPU, the communication
and alpha-beta time of one step, and the decision rule of 4.1.8.

``model`` is the pure part (the tables the JavaScript reads, and the Python twin of every
JavaScript function); ``render`` builds the HTML (forms, ``calc.js`` with the formulas,
``ui.js`` with the page logic); ``calculator(...)`` is the verb a page calls. In the page,
``window.dpbookCalc.ledger``, ``.stepBytes``, ``.stepTime`` and ``.recommend`` take the Python
keyword arguments and return the Python fields; the browser test holds them equal to
``memory.vram_ledger``, ``costs.fsdp_step_bytes`` / ``internode_bytes``, ``costs.step_time`` and
``decision.recommend``.
"""

from __future__ import annotations

import html
import uuid

from ...checks import one_of
from . import model, render
from .model import PANELS, TWINS, data

__all__ = ["Calculator", "calculator", "PANELS", "TWINS", "data", "model", "render"]


class Calculator:
    """One or more panels (``PANELS``) whose inputs live in the URL hash under ``key``."""

    def __init__(self, panels, key: str, presentation: bool = False):
        if not panels or len(set(panels)) != len(panels):
            raise ValueError(f"panels phải gồm 1 đến {len(PANELS)} công cụ khác nhau trong "
                             f"{PANELS}, nhận được {tuple(panels)!r}.")
        for p in panels:
            one_of("panel", p, PANELS)
        if not key.isidentifier():
            raise ValueError(f"key là tiền tố của các khóa trong URL (chữ, số, dấu gạch dưới, "
                             f"không bắt đầu bằng số), nhận được {key!r}.")
        self.panels, self.key, self.presentation = tuple(panels), key, presentation
        self.id = "dpc-" + uuid.uuid4().hex[:10]

    def to_html(self) -> str:
        return render.render(self.id, self.panels, self.key, self.presentation)

    def standalone_html(self) -> str:
        """A complete page: opens from disk in any browser."""
        title = " · ".join(render.TITLES[p] for p in self.panels)
        return ('<!DOCTYPE html><html lang="vi"><head><meta charset="utf-8">'
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{html.escape(title)}</title>"
                "<style>body{margin:2vh 3vw;background:#fff}</style></head><body>"
                f"{self.to_html()}</body></html>")

    def _repr_html_(self) -> str:
        return self.to_html()


def calculator(*panels: str, key: str = "", presentation: bool = False) -> Calculator:
    """The calculator with ``panels`` (default: all three). ``key``: the prefix of its inputs in
    the URL hash, different for each calculator of one page (default: the panels' names)."""
    panels = panels or PANELS
    return Calculator(panels, key or "_".join(panels), presentation)
