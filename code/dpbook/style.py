"""The book's look, shared by SVG widgets and matplotlib figures: one palette and one set of
size constants. The cards the book compares against are ``memory.CARDS``."""

from __future__ import annotations

# Okabe & Ito's palette, distinguishable with the common colour-vision deficiencies.
PALETTE = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#000000",
    "grey": "#999999",
    "light": "#EEEEEE",
}
RANK_COLOURS = ["orange", "sky", "green", "purple", "blue", "vermillion", "yellow", "grey"]
# The order in which a figure colours its series (strategies, kinds of state).
SERIES = ("blue", "orange", "green", "purple", "sky")
EDGE = "#333333"  # outline of bars and boxes

# Decimal units (this book's GB: 10⁹ B) and binary ones (PyTorch's MiB and GiB). A card's
# "80 GB" is 80 GiB: see ``memory.Card``.
KB, MB, GB = 1e3, 1e6, 1e9
KIB, MIB, GIB = 1024, 1024**2, 1024**3


def rank_colour(rank: int) -> str:
    return PALETTE[RANK_COLOURS[rank % len(RANK_COLOURS)]]


def series_colour(i: int) -> str:
    return PALETTE[SERIES[i % len(SERIES)]]
