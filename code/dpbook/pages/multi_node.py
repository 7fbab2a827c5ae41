"""Figures of section 4.2.4 (torchrun, several nodes), drawn from what real runs reported.

``node_figure`` draws the nodes (one torchrun agent each) and their workers, labelled with the
``RANK`` / ``LOCAL_RANK`` each worker received; given the process groups that hybrid sharding
used, it also frames each shard group and joins the members of each replicate group.
Colours are the book's colour-blind-safe palette (``widgets.svg``); labels are Vietnamese.
"""

from __future__ import annotations

from ..style import PALETTE, rank_colour

_W, _H, _GAP = 2.2, 1.1, 0.5  # a worker box, and the space between boxes (data units)


def worker_positions(layout: list[tuple[int, int, int]]) -> dict[int, tuple[float, float]]:
    """Lower-left corner of each worker box, keyed by rank: node ``GROUP_RANK`` is a row (node
    0 on top), ``LOCAL_RANK`` the column. ``layout``: ``(rank, local_rank, group_rank)``."""
    nodes = max(g for _, _, g in layout) + 1
    return {rank: (0.4 + local * (_W + _GAP), (nodes - 1 - group) * (_H + 1.3) + 0.3)
            for rank, local, group in layout}


def node_figure(layout: list[tuple[int, int, int]], shard_groups=None, replicate_groups=None,
                title: str = ""):
    """Nodes as frames, workers as boxes; optional shard groups (shaded frames) and replicate
    groups (dashed lines between their members)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    pos = worker_positions(layout)
    per_node = max(l for _, l, _ in layout) + 1
    width = 0.8 + per_node * _W + (per_node - 1) * _GAP
    fig, ax = plt.subplots(figsize=(2.2 + 2.4 * per_node, 1.6 + 1.9 * len({g for *_, g in layout})))
    for group in sorted({g for *_, g in layout}):
        y = min(pos[r][1] for r, _, g in layout if g == group) - 0.3
        ax.add_patch(FancyBboxPatch((0, y), width, _H + 0.95, boxstyle="round,pad=0.02",
                                    fc="#f4f4f4", ec="#555555", lw=1.2, zorder=0.5))
        ax.text(0.1, y + _H + 0.75, f"node {group} (GROUP_RANK = {group}): một agent torchrun",
                fontsize=11, va="center")
    for group in shard_groups or []:
        xs, ys = zip(*(pos[r] for r in group))
        ax.add_patch(Rectangle((min(xs) - 0.15, min(ys) - 0.15), max(xs) - min(xs) + _W + 0.3,
                               _H + 0.3, fc="none", ec=PALETTE["green"], lw=2.5, zorder=1))
    for group in replicate_groups or []:
        pts = [(pos[r][0] + _W / 2, pos[r][1] + _H / 2) for r in group]
        ax.plot(*zip(*pts), ls="--", lw=2.5, color=PALETTE["vermillion"], zorder=1.5)
    for rank, local, _ in layout:
        x, y = pos[rank]
        ax.add_patch(Rectangle((x, y), _W, _H, fc=rank_colour(rank), ec="black", zorder=2))
        ax.text(x + _W / 2, y + _H / 2, f"RANK {rank}\nLOCAL_RANK {local}", ha="center",
                va="center", fontsize=11, zorder=3)
    handles = []
    if shard_groups:
        handles.append(plt.Line2D([], [], color=PALETTE["green"], lw=2.5,
                                  label="nhóm shard (AllGather, ReduceScatter)"))
    if replicate_groups:
        handles.append(plt.Line2D([], [], color=PALETTE["vermillion"], lw=2.5, ls="--",
                                  label="nhóm replicate (AllReduce shard gradient)"))
    if handles:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=1,
                  frameon=False, fontsize=10)
    ax.set_xlim(-0.1, width + 0.1)
    ax.set_ylim(-0.2, max(y for _, y in pos.values()) + _H + 0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=12, loc="left")
    fig.tight_layout()
    return fig


def two_node_command(endpoint: str, nproc_per_node: int = 8,
                     checkpoint: str = "/shared/ket-qua/ddp.pt", job_id: str = "job42") -> str:
    """The one ``torchrun`` line that 4.2.4 types, unchanged, on every node of a two-node job
    (c10d rendezvous at ``endpoint``: the agents number the nodes themselves, so no
    ``--node_rank``). ``checkpoint`` must be on a file system every node sees: rank 0 may land on
    either node. tests/scripts/test_commands.py runs it on two agents of one machine."""
    return (f"torchrun --nnodes=2 --nproc_per_node={nproc_per_node} --rdzv_backend=c10d "
            f"--rdzv_endpoint={endpoint} --rdzv_id={job_id} "
            f"train_ddp.py --epochs 3 --checkpoint {checkpoint}")
