"""The book's look, shared by SVG widgets and matplotlib figures: one palette, one set of
size constants, one list of GPU memory sizes."""

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

# Decimal units (what GPU vendors and this book's GB mean) and binary ones (PyTorch's MiB).
KB, MB, GB = 1e3, 1e6, 1e9
KIB, MIB, GIB = 1024, 1024**2, 1024**3
# Memory of the GPUs the book compares against, in GB as the vendors name them: RTX 3090/4090,
# A100 40GB, A100/H100 80GB, H200.
GPUS_GB = (24, 40, 80, 141)


def rank_colour(rank: int) -> str:
    return PALETTE[RANK_COLOURS[rank % len(RANK_COLOURS)]]


def series_colour(i: int) -> str:
    return PALETTE[SERIES[i % len(SERIES)]]
