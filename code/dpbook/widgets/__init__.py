"""Animations and calculators of the chapter: a pure frame model per widget, an SVG renderer,
the static ``Player`` (offline HTML) and live ipywidgets controls (``live``)."""

from .player import Frame, Player

__all__ = ["Frame", "Player"]
