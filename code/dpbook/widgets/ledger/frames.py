"""VRAM ledger calculator: bytes per rank, stacked by kind, one bar per strategy.

Model (pure data, ``ledger_frames``): for a model preset, a precision and an optimizer, one
``LedgerFrame`` per world size, each with one ``Bar`` per strategy. Every number in a bar is
``dpbook.memory.vram_ledger``'s, never recomputed here (DDP's bar carries its bucket copy of
the gradients, ``Ledger.buffers``, unless ``bucket_view=True``); this module only adds the parameter
counts of the presets (``dpbook.shapes``, computed from the architecture, not typed in) and
the verdict "does it fit on this card".

Fitting: a configuration fits on a card (``memory.Card``) when the ledger's total per rank is at
most what PyTorch can allocate there, ``Card.usable_bytes``: the card's GiB less the driver's
reservation and the CUDA context (``memory.fits``). That is still optimistic: fragmentation,
communication buffers and temporaries are not counted, and activations only if given.

The static players (``player``, ``measured_player``) and the live controls are in the package's
``__init__``; the SVG renderer is ``widgets.ledger.render``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ... import vi
from ...checks import int_at_least, non_negative, one_of
from ...memory import (CARDS, OPTIMIZERS, PHASES, PRECISIONS, STRATEGIES, Card, Ledger,
                        vram_ledger)
from ...memory import fits as fits_card
from ...shapes import presets

WORLD_SIZES = (1, 2, 4, 8, 16, 64)
DEFAULT_STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
# What each strategy shards, as the second line under its bar.
NOTES = {"DDP": "không chia mảnh", "NO_SHARD": "không chia mảnh", "ZeRO-1": "chia bộ tối ưu",
         "ZeRO-2": "+ chia gradient", "ZeRO-3": "chia mảnh tất cả",
         "FULL_SHARD": "chia mảnh tất cả", "SHARD_GRAD_OP": "giữ tham số đủ",
         "HYBRID_SHARD": "chia trong nhóm"}


@dataclass(frozen=True)
class Bar:
    """One strategy's bytes per rank, and on which cards (``LedgerFrame.cards``) it fits."""

    label: str
    note: str
    ledger: Ledger
    fits: tuple[bool, ...]
    shard_size: int | None = None
    group: str = ""  # bars of one group get one name under them (predicted | measured pairs)
    measured: bool = False  # drawn lighter


@dataclass(frozen=True)
class LedgerFrame:
    title: str
    world_size: int
    bars: tuple[Bar, ...]
    cards: tuple[Card, ...]
    caption: str


def fits(total_bytes: float, cards=CARDS) -> tuple[bool, ...]:
    """For each card, whether ``total_bytes`` per rank fit in what PyTorch can allocate there."""
    return tuple(fits_card(total_bytes, c) for c in cards)


def verdict(bar: Bar, cards=CARDS) -> str:
    """One Vietnamese clause: how much the bar needs and the smallest card it fits on."""
    need = f"{bar.label} cần {vi.nbytes(bar.ledger.total)}/rank"
    ok = [c for c, f in zip(cards, bar.fits) if f]
    if not ok:
        return f"{need}, không vừa GPU nào"
    if len(ok) == len(cards):
        return f"{need}, vừa mọi GPU"
    if len(ok) == 1:
        return f"{need}, chỉ vừa {ok[0].name}"
    return f"{need}, vừa từ {min(ok, key=lambda c: c.usable_bytes).name} trở lên"


def _grouped(bars, cards) -> str:
    """Verdicts with equal totals merged ("ZeRO-2, SHARD_GRAD_OP cần …"), in bar order."""
    groups: dict[float, list[Bar]] = {}
    for b in bars:
        groups.setdefault(b.ledger.total, []).append(b)
    return "; ".join(verdict(replace(g[0], label=", ".join(b.label for b in g)), cards)
                     for g in groups.values())


def ledger_frames(preset: str = "llama-7b", *, world_sizes=WORLD_SIZES,
                  strategies=DEFAULT_STRATEGIES, precision: str = "mixed",
                  optimizer: str = "adam", phase: str = "step", shard_size: int = 8,
                  activation_bytes: float = 0.0, cards=CARDS,
                  bucket_view: bool = False) -> list[LedgerFrame]:
    """One frame per world size: as N grows, sharded strategies' bars shrink, DDP's do not.

    HYBRID_SHARD shards inside groups of ``shard_size`` ranks (GPUs per node); when the whole
    world is smaller than one group, the group is the world (``min(shard_size, N)``).
    """
    _check(preset, world_sizes, strategies, precision, optimizer, phase, shard_size,
           activation_bytes, cards)
    p = presets()[preset]
    kw = dict(precision=precision, optimizer=optimizer, phase=phase,
              largest_unit_params=p.largest_unit, root_unit_params=p.root_unit,
              activation_bytes=float(activation_bytes), bucket_view=bucket_view)
    frames = []
    for n in world_sizes:
        bars = tuple(_bar(p.num_params, n, s, shard_size, tuple(cards), kw) for s in strategies)
        title = (f"{p.label} · {vi.count(p.num_params)} tham số · N = {n} GPU · {precision} · "
                 f"{optimizer} · {phase}")
        head = "N = 1: một GPU, mọi chiến lược như nhau. " if n == 1 else f"N = {n}: "
        caption = head + _grouped(bars, cards) + "."
        frames.append(LedgerFrame(title, n, bars, tuple(cards), caption))
    return frames


def _bar(num_params, n, strategy, shard_size, cards, kw) -> Bar:
    s = min(shard_size, n) if strategy == "HYBRID_SHARD" else None
    led = vram_ledger(num_params, n, strategy, shard_size=s, **kw)
    note = f"nhóm shard {s}" if s else NOTES[strategy]
    return Bar(strategy, note, led, fits(led.total, cards), s)


def _check(preset, world_sizes, strategies, precision, optimizer, phase, shard_size,
           activation_bytes, cards) -> None:
    one_of("preset", preset, presets())
    one_of("precision", precision, PRECISIONS)
    one_of("optimizer", optimizer, OPTIMIZERS)
    one_of("phase", phase, PHASES)
    int_at_least("shard_size", shard_size)
    non_negative("activation_bytes", activation_bytes)
    if not world_sizes:
        raise ValueError("world_sizes rỗng: cần ít nhất một số GPU, ví dụ (1, 2, 4, 8).")
    for n in world_sizes:
        int_at_least("world_size", n)
    if not 1 <= len(strategies) <= 8 or len(set(strategies)) != len(strategies):
        raise ValueError(f"strategies phải gồm 1 đến 8 chiến lược khác nhau, nhận được "
                         f"{tuple(strategies)!r}.")
    for s in strategies:
        one_of("strategy", s, STRATEGIES)
    for c in cards:
        if not isinstance(c, Card):
            raise ValueError(f"cards phải gồm các memory.Card (ví dụ memory.CARDS), nhận được "
                             f"{c!r}.")


MEASURED = ("DDP", "NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")


def measured_parallel(strategy: str):
    """The ``train.Parallel`` that realises ``strategy`` in ``measure.measure_step``."""
    from ...train import Parallel

    one_of("strategy", strategy, MEASURED)
    return Parallel.for_strategy(strategy)


def compare(results: dict, world_size: int = 2) -> list[tuple[str, Ledger, Ledger]]:
    """``(strategy, predicted, measured)`` for each ``results[strategy]`` (rank 0's dict from
    ``measure_step``). ``measure_step`` reads the state right after ``optimizer.step()``, in
    fp32 with Adam, from the storages the rank allocated (DDP's buckets included): that is the
    ledger's ``phase="rest"``."""
    rows = []
    for strategy, r in results.items():
        one_of("strategy", strategy, MEASURED)
        predicted = vram_ledger(r["num_params"], world_size, strategy, precision="fp32",
                                optimizer="adam", phase="rest")
        st = r["state"]
        rows.append((strategy, predicted, st.as_ledger()))
    return rows


def measured_frame(results: dict, world_size: int = 2) -> LedgerFrame:
    """Predicted and measured bars side by side (no GPU table: a few KB fit anywhere)."""
    bars = []
    for strategy, predicted, measured in compare(results, world_size):
        bars.append(Bar("dự đoán", "", predicted, (), group=strategy))
        bars.append(Bar("đo được", "", measured, (), group=strategy, measured=True))
    first = next(iter(results.values()))
    n, backend = first["num_params"], first.get("backend", "gloo")
    caption = (f"MLP nhỏ ({n} tham số), {world_size} process {backend}, fp32, Adam, sau "
               "optimizer.step(): mỗi cặp cột là công thức (trái) và số byte rank 0 đã cấp phát "
               "và còn giữ, đo bằng cách điểm các vùng nhớ (phải).")
    return LedgerFrame(f"Đo được so với dự đoán: N = {world_size}, fp32, Adam", world_size,
                       tuple(bars), (), caption)
