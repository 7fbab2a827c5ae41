"""Figures of section 4.1.3 (DDP), drawn from what real runs returned (``ddp_demo``).

* ``sampler_figure``: for each epoch, which rank receives each sample of the data set, and in
  which position of that rank's order; one panel without ``set_epoch``, one with.
* ``timeline_rows`` / ``collectives_figure``: the collectives one rank issued, in order, from
  DDP's construction through a few training steps, as bars of their size in bytes.

Colours are the book's colour-blind-safe palette (``dpbook.style``); labels are Vietnamese.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import vi
from .style import PALETTE, rank_colour

COLLECTIVE_COLOURS = {"broadcast": PALETTE["blue"], "all_reduce": PALETTE["vermillion"],
                      "all_gather": PALETTE["green"]}


def owner_grid(per_rank: list[list[list[int]]], dataset_size: int) -> list[list[tuple]]:
    """``grid[epoch][i]``: the ``(rank, position)`` pairs that received sample ``i`` in that
    epoch (one pair when the ranks partition the data set)."""
    epochs = len(per_rank[0])
    grid = [[() for _ in range(dataset_size)] for _ in range(epochs)]
    for rank, orders in enumerate(per_rank):
        for epoch, order in enumerate(orders):
            for pos, i in enumerate(order):
                grid[epoch][i] = grid[epoch][i] + ((rank, pos),)
    return grid


def sampler_figure(without: list[list[list[int]]], with_: list[list[list[int]]],
                   dataset_size: int):
    """Two panels of ``epochs`` rows by ``dataset_size`` cells: colour = rank, number = position
    in that rank's order. ``without[r][e]``: rank ``r``'s order in epoch ``e``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    epochs = len(without[0])
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.1 * 2 * epochs + 1.6))
    titles = ("Không gọi set_epoch(): mọi epoch giống hệt nhau",
              "Có gọi set_epoch(epoch): mỗi epoch một cách chia và thứ tự mới")
    for ax, orders, title in zip(axes, (without, with_), titles):
        grid = owner_grid(orders, dataset_size)
        for e, row in enumerate(grid):
            for i, cell in enumerate(row):
                (rank, pos), = cell  # exactly one rank per sample: the figure relies on it
                ax.add_patch(Rectangle((i, e), 0.94, 0.9, color=rank_colour(rank)))
                ax.text(i + 0.47, e + 0.45, str(pos), ha="center", va="center", fontsize=10)
        ax.set_xlim(0, dataset_size)
        ax.set_ylim(epochs, 0)
        ax.set_xticks([i + 0.47 for i in range(dataset_size)], range(dataset_size))
        ax.set_yticks([e + 0.45 for e in range(epochs)], [f"epoch {e}" for e in range(epochs)])
        ax.set_title(title, fontsize=12, loc="left")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    axes[1].set_xlabel("chỉ số mẫu trong tập dữ liệu (số trong ô: thứ tự rank duyệt tới mẫu)")
    fig.legend(handles=[Patch(color=rank_colour(r), label=f"rank {r}")
                        for r in range(len(without))],
               loc="upper right", ncol=len(without), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


@dataclass(frozen=True)
class Row:
    """One collective in a rank's timeline."""

    phase: str  # "khởi tạo DDP", "bước 0", ...
    collective: str
    nbytes: int


def timeline_rows(construction, steps) -> list[Row]:
    """Flatten ``ddp_lifecycle``'s records (construction, then each step) into rows."""
    rows = [Row("khởi tạo DDP", r.collective, r.nbytes) for r in construction]
    for k, records in enumerate(steps):
        rows += [Row(f"bước {k}", r.collective, r.nbytes) for r in records]
    return rows


def collectives_figure(rows: list[Row]):
    """Bars of bytes (log scale) per collective, in issue order, one shaded band per phase."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(10, 4.2))
    x, spans = 0.0, []  # spans: [phase, first x, last x]
    for row in rows:
        if not spans or spans[-1][0] != row.phase:
            x += 0.8 if spans else 0.0
            spans.append([row.phase, x, x])
        spans[-1][2] = x + 0.8
        ax.bar(x, row.nbytes, width=0.8, align="edge",
               color=COLLECTIVE_COLOURS.get(row.collective, PALETTE["grey"]))
        ax.text(x + 0.4, row.nbytes * 1.15, vi.grouped(row.nbytes),
                ha="center", va="bottom", fontsize=8, rotation=90)
        x += 1.0
    for _, a, b in spans:
        ax.axvspan(a - 0.15, b + 0.15, color=PALETTE["light"], zorder=0)
    ax.set_xticks([(a + b) / 2 for _, a, b in spans], [p for p, _, _ in spans], fontsize=10)
    ax.tick_params(axis="x", length=0)
    ax.set_xlim(-0.4, x + 0.2)
    ax.set_yscale("log")
    ax.set_ylim(1, max(r.nbytes for r in rows) * 30)
    ax.set_ylabel("số byte của tensor (thang log)")
    ax.set_title("Các phép toán tập thể mà một rank phát ra, theo thứ tự thời gian",
                 fontsize=12, loc="left")
    names = {"broadcast": "Broadcast", "all_reduce": "AllReduce", "all_gather": "AllGather"}
    kinds = [k for k in names if any(r.collective == k for r in rows)]
    ax.legend(handles=[Patch(color=COLLECTIVE_COLOURS[k], label=names[k]) for k in kinds],
              loc="upper left", frameon=False, ncol=len(kinds))
    fig.tight_layout()
    return fig
