"""Section 4.1.7 (the VRAM ledger): the ledger against a real run, and the ZeRO paper's example.

* ``measure_strategies``: one launch that trains the chapter's small MLP under DDP, FSDP1
  (NO_SHARD, SHARD_GRAD_OP, FULL_SHARD) and FSDP2, and measures each with
  ``measure.measure_step``; it also measures DDP's peak with ``gradient_as_bucket_view=True``,
  to show what the bucket buffers cost, and what FSDP2 holds of a unit while it computes
  (``gathered_unit``).
* ``compare_rows`` / ``comparison_table``: measured state bytes beside ``memory.vram_ledger``.
* ``zero_stages``, ``max_params``: the ZeRO formulas for a model and the largest model a card
  (``memory.Card``) holds; ``stacked_bars``: the per-GPU figure with, as lines, what PyTorch can
  allocate on each card; ``cards_table``: how "80 GB" becomes that number.

Every number comes from ``memory.vram_ledger``; nothing here has a formula of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import style, vi
from ..checks import int_at_least, one_of
from ..memory import CARDS as ALL_CARDS
from ..memory import PRECISIONS, STRATEGIES, Card, Ledger, fits, vram_ledger
from ..style import GB, GIB
from ..train import Parallel
from ..widgets import ledger

# 4.1.7 compares three cards: the book's list without the A100 40GB.
CARDS = tuple(c for c in ALL_CARDS if c.name != "A100 40GB")
ZERO_STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
# (name shown, how to wrap, the ledger strategy it realises at rest)
# (name shown, wrapping); the ledger strategy each realises is ``Parallel.ledger_strategy``.
RUNS = (
    ("DDP", Parallel("ddp")),
    ("FSDP1 NO_SHARD", Parallel.for_strategy("NO_SHARD")),
    ("FSDP1 SHARD_GRAD_OP", Parallel.for_strategy("SHARD_GRAD_OP")),
    ("FSDP1 FULL_SHARD", Parallel.for_strategy("FULL_SHARD")),
    ("FSDP2 fully_shard", Parallel("fsdp2")),
)
KIND_LABELS = (("params", "tham số"), ("grads", "gradient"),
               ("optimizer", "trạng thái bộ tối ưu"), ("activations", "activation"))


def ddp_bucket_view_peak(rank: int, world_size: int, batch_size: int = 8, warmup: int = 2):
    """Peak memory of one DDP step with ``gradient_as_bucket_view=True``: the gradients are
    views into the bucket buffers instead of a second copy (compare ``measure_step``'s DDP)."""
    import torch

    from ..data import rank_batch, synthetic_regression
    from ..measure import peak_memory
    from ..models import build_mlp
    from ..train import apply_ddp, train_step

    model = build_mlp()
    wrapped = apply_ddp(model, gradient_as_bucket_view=True)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    ds = synthetic_regression(batch_size * world_size, model.blocks[0].linear.in_features,
                              model.head.out_features)
    dev = next(wrapped.parameters()).device
    x, y = rank_batch(ds.tensors, rank, batch_size, dev)
    for _ in range(warmup):  # Adam creates its state, DDP rebuilds its buckets
        train_step(wrapped, optimizer, x, y)
    return peak_memory(lambda: train_step(wrapped, optimizer, x, y), wrapped, optimizer)


def gathered_unit(rank: int, world_size: int, block: int = 1, batch_size: int = 8) -> dict:
    """Rank function: what an FSDP2 rank holds of one unit (``blocks[block]`` of the small MLP)
    while that unit computes its forward, in bytes of storage: its shard of the parameters
    (``FSDPParam._sharded_param_data``, which FSDP2 never frees), the unsharded parameters
    (``FSDPParam.all_gather_outputs``, full size), the AllGather's output buffer, still held in
    ``comm_ctx.all_gather_state`` until the next unit's ``wait_for_unshard``
    (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``), and the unit's full size;
    ``shard_inside`` says whether the shard's storage is one of the unsharded tensors (it is
    not: the whole unit is allocated beside the shard)."""
    import torch

    from ..data import rank_batch, synthetic_regression
    from ..models import build_mlp
    from ..train import apply_fsdp2, train_step

    model = apply_fsdp2(build_mlp())
    unit = model.blocks[block]
    group = unit._get_fsdp_state()._fsdp_param_group
    seen = {}

    def look(*_):
        fps = group.fsdp_params
        full = {fp.all_gather_outputs[0].untyped_storage().data_ptr():
                fp.all_gather_outputs[0].untyped_storage().nbytes() for fp in fps}
        held = group.comm_ctx.all_gather_state
        seen.update(
            shard=sum(fp._sharded_param_data.untyped_storage().nbytes() for fp in fps),
            unsharded=sum(full.values()),
            buffer=0 if held is None
            else held.all_gather_result.all_gather_output.untyped_storage().nbytes(),
            unit=sum(p.numel() * p.element_size() for p in unit.parameters()),
            shard_inside=any(fp._sharded_param_data.untyped_storage().data_ptr() in full
                             for fp in fps))

    hook = unit.linear.register_forward_pre_hook(look)  # inside the unit: it is unsharded
    ds = synthetic_regression(batch_size * world_size)
    x, y = rank_batch(ds.tensors, rank, batch_size, next(model.parameters()).device)
    train_step(model, torch.optim.Adam(model.parameters(), lr=1e-3), x, y)
    hook.remove()
    return seen


def measure_strategies(rank: int, world_size: int, runs=RUNS) -> dict:
    """Rank function for ``launch.spawn``: ``measure_step`` for each of ``runs`` (keyed by the
    name shown), one launch for the whole page, plus ``"bucket_view_peak"`` and
    ``"gathered"`` (``gathered_unit``).

    FSDP1 and FSDP2 wrappers form reference cycles, so a finished run's model stays allocated
    until the garbage collector runs; on a GPU, ``max_memory_allocated`` would count it in the
    next run's peak. ``gc.collect()`` before each run frees it."""
    import gc

    from ..measure import measure_step

    out = {}
    for name, par in runs:
        gc.collect()
        out[name] = measure_step(rank, world_size, par)
    gc.collect()
    out["bucket_view_peak"] = ddp_bucket_view_peak(rank, world_size)
    gc.collect()
    out["gathered"] = gathered_unit(rank, world_size)
    return out


@dataclass(frozen=True)
class Row:
    """One run: what the ledger predicts at rest and what rank 0 held after ``step()``."""

    name: str
    strategy: str
    predicted: Ledger
    measured: Ledger
    peak: int

    @property
    def equal(self) -> bool:
        """The ledger's parameters, gradients and optimizer state equal what the rank held
        (DDP's bucket copy, ``Ledger.buffers``, is not state: the peak measures it)."""
        p, m = self.predicted, self.measured
        return (p.params, p.grads, p.optimizer) == (m.params, m.grads, m.optimizer)


def compare_rows(results: dict, world_size: int = 2, runs=RUNS) -> list[Row]:
    """``measure_strategies``' rank-0 dict against ``vram_ledger(..., phase="rest")`` (fp32,
    Adam: ``measure_step`` reads the state right after ``optimizer.step()``)."""
    int_at_least("world_size", world_size)
    rows = []
    for name, par in runs:
        r = results[name]
        (strategy, predicted, measured), = ledger.compare({par.ledger_strategy: r}, world_size)
        rows.append(Row(name, strategy, predicted, measured, r["peak"].peak))
    return rows


def comparison_table(rows: list[Row]) -> str:
    """An aligned plain-text table (bytes), predicted and measured on consecutive lines."""
    head = (f"{'cách chạy':<21}{'sổ kế toán':<15}{'':<9}{'tham số':>9}{'gradient':>10}"
            f"{'bộ tối ưu':>11}{'tổng':>8}{'đỉnh đo':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        for kind, led in (("dự đoán", r.predicted), ("đo được", r.measured)):
            first = kind == "dự đoán"
            peak = "" if first else f"{r.peak:>9}"
            lines.append(f"{r.name if first else '':<21}{r.strategy if first else '':<15}"
                         f"{kind:<9}{led.params:>9.0f}{led.grads:>10.0f}{led.optimizer:>11.0f}"
                         f"{led.state:>8.0f}{peak}")
    return "\n".join(lines)


def zero_stages(num_params: int, world_size: int, precision: str = "mixed",
                **kwargs) -> dict[str, Ledger]:
    """The ledger of DDP and ZeRO-1/2/3 for one model on ``world_size`` GPUs."""
    return {s: vram_ledger(num_params, world_size, s, precision=precision, **kwargs)
            for s in ZERO_STAGES}


def max_params(gpu: Card, world_size: int, strategy: str, precision: str = "mixed",
               optimizer: str = "adam") -> int:
    """The largest parameter count whose state (no activations) fits in what PyTorch can
    allocate on ``gpu`` (``memory.fits``), per rank."""
    one_of("strategy", strategy, STRATEGIES)
    one_of("precision", precision, PRECISIONS)
    if not isinstance(gpu, Card):
        raise ValueError(f"gpu phải là một memory.Card (ví dụ memory.card(\"H100 80GB\")), nhận "
                         f"được {gpu!r}.")

    def state(p: int) -> float:
        return vram_ledger(p, world_size, strategy, precision=precision,
                           optimizer=optimizer).state

    # state is linear in num_params: one parameter's bytes per rank, then divide
    p = int(gpu.usable_bytes / state(1))
    while fits(state(p + 1), gpu):  # float rounding guard
        p += 1
    while p and not fits(state(p), gpu):
        p -= 1
    return p


def cards_table(cards=ALL_CARDS) -> str:
    """An aligned plain-text table: each card's marketed size, what its chips hold (GiB), the
    total the driver reports, the CUDA context, and what is left for PyTorch, in GiB and GB."""
    def gib(n: float) -> str:
        return vi.number(n / GIB, 2)

    head = (f"{'card':<11}{'tên ghi':>8}{'chip (GiB)':>12}{'total (GiB)':>13}"
            f"{'context (MiB)':>15}{'dùng được (GiB)':>17}{'(GB)':>8}")
    lines = [head, "-" * len(head)]
    for c in cards:
        lines.append(f"{c.name:<11}{str(c.marketed_gb) + ' GB':>8}{gib(c.capacity_bytes):>12}"
                     f"{gib(c.total_bytes):>13}{vi.number(c.context_bytes / 2**20, 0):>15}"
                     f"{gib(c.usable_bytes):>17}{vi.number(c.usable_bytes / GB, 2):>8}")
    return "\n".join(lines)


def stacked_bars(ledgers: dict[str, Ledger], cards=CARDS, title: str = ""):
    """Per-GPU memory as stacked bars (one per strategy), with what PyTorch can allocate on each
    card as a dashed line; GB (10⁹ B) throughout, Vietnamese labels. Returns the ``Figure``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    names = list(ledgers)
    base = [0.0] * len(names)
    for i, (field, label) in enumerate(KIND_LABELS):
        values = [getattr(ledgers[n], field) / GB for n in names]
        if any(values):
            ax.bar(names, values, bottom=base, color=style.series_colour(i), label=label,
                   edgecolor=style.EDGE)
            base = [b + v for b, v in zip(base, values)]
    for i, total in enumerate(base):
        ax.text(i, total + 1.5, f"{vi.number(total, 1)} GB", ha="center",
                fontweight="bold")
    for c in cards:
        g = c.usable_bytes / GB
        ax.axhline(g, color=style.PALETTE["vermillion"], linestyle="--", linewidth=1.2)
        ax.text(len(names) - 0.5, g + 1.5, f"{c.name}: {vi.number(g, 1)} GB dùng được",
                color=style.PALETTE["vermillion"], ha="right")
    ax.set_ylim(0, max(max(base), max((c.usable_bytes / GB for c in cards), default=0)) * 1.12)
    ax.set_ylabel("GB (10⁹ byte) mỗi GPU")
    ax.set_title(title)
    ax.legend(loc="upper center", ncol=4, bbox_to_anchor=(0.5, -0.08), frameon=False)
    fig.tight_layout()
    return fig
