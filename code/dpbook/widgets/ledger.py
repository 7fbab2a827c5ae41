"""VRAM ledger calculator: bytes per rank, stacked by kind, one bar per strategy.

Model (pure data, ``ledger_frames``): for a model preset, a precision and an optimizer, one
``LedgerFrame`` per world size, each with one ``Bar`` per strategy. Every number in a bar is
``dpbook.memory.vram_ledger``'s, never recomputed here; this module only adds the parameter
counts of the presets (``dpbook.shapes``, computed from the architecture, not typed in) and
the verdict "does it fit on a GPU of G GB".

Fitting: a configuration fits on a GPU of G GB when the ledger's total per rank is at most
G x 10^9 bytes (decimal GB, as the chapter uses). That is optimistic: the CUDA context,
fragmentation and temporaries are not counted, and activations only if given.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ..checks import int_at_least, non_negative, one_of
from ..memory import OPTIMIZERS, PHASES, PRECISIONS, STRATEGIES, Ledger, vram_ledger
from ..shapes import presets
from .player import Frame, Player
from .svg import PALETTE, Svg

GB = 1e9
GPUS_GB = (24, 40, 80, 141)  # RTX 3090/4090, A100 40GB, A100/H100 80GB, H200
WORLD_SIZES = (1, 2, 4, 8, 16, 64)
DEFAULT_STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
# What each strategy shards, as the second line under its bar.
NOTES = {"DDP": "không shard", "NO_SHARD": "không shard", "ZeRO-1": "shard bộ tối ưu",
         "ZeRO-2": "+ shard gradient", "ZeRO-3": "shard tất cả", "FULL_SHARD": "shard tất cả",
         "SHARD_GRAD_OP": "giữ tham số đủ", "HYBRID_SHARD": "shard trong nhóm"}
KINDS = (("params", "tham số", "blue"), ("grads", "gradient", "orange"),
         ("optimizer", "trạng thái bộ tối ưu", "green"), ("activations", "activation", "purple"))


@dataclass(frozen=True)
class Bar:
    """One strategy's bytes per rank, and on which GPUs (``LedgerFrame.gpus_gb``) it fits."""

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
    gpus_gb: tuple[float, ...]
    caption: str


def fits(total_bytes: float, gpus_gb=GPUS_GB) -> tuple[bool, ...]:
    """For each GPU size, whether ``total_bytes`` per rank fit in it."""
    return tuple(total_bytes <= g * GB for g in gpus_gb)


def verdict(bar: Bar, gpus_gb=GPUS_GB) -> str:
    """One Vietnamese clause: how much the bar needs and the smallest GPU it fits on."""
    need = f"{bar.label} cần {human(bar.ledger.total)}/rank"
    ok = [g for g, f in zip(gpus_gb, bar.fits) if f]
    if not ok:
        return f"{need}, không vừa GPU nào"
    if len(ok) == len(gpus_gb):
        return f"{need}, vừa mọi GPU"
    if len(ok) == 1:
        return f"{need}, chỉ vừa GPU {_num(ok[0])} GB"
    return f"{need}, vừa GPU từ {_num(min(ok))} GB trở lên"


def _grouped(bars, gpus_gb) -> str:
    """Verdicts with equal totals merged ("ZeRO-2, SHARD_GRAD_OP cần …"), in bar order."""
    groups: dict[float, list[Bar]] = {}
    for b in bars:
        groups.setdefault(b.ledger.total, []).append(b)
    return "; ".join(verdict(replace(g[0], label=", ".join(b.label for b in g)), gpus_gb)
                     for g in groups.values())


def human(nbytes: float) -> str:
    """Bytes with a decimal unit and a Vietnamese decimal comma: ``107,8 GB``."""
    for unit, scale in (("GB", GB), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{_num(nbytes / scale)} {unit}"
    return f"{_num(nbytes)} B"


def _num(x: float) -> str:
    text = f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text.replace(".", ",")


def _count(n: int) -> str:
    """A parameter count in Vietnamese words: ``6,74 tỷ``, ``124 triệu``."""
    if n >= 1e9:
        return f"{_num(n / 1e9)} tỷ"
    return f"{_num(n / 1e6)} triệu" if n >= 1e6 else str(n)


# ---------------------------------------------------------------- the frame model (data only)

def ledger_frames(preset: str = "llama-7b", *, world_sizes=WORLD_SIZES,
                  strategies=DEFAULT_STRATEGIES, precision: str = "mixed",
                  optimizer: str = "adam", phase: str = "step", shard_size: int = 8,
                  activation_bytes: float = 0.0, gpus_gb=GPUS_GB) -> list[LedgerFrame]:
    """One frame per world size: as N grows, sharded strategies' bars shrink, DDP's do not.

    HYBRID_SHARD shards inside groups of ``shard_size`` ranks (GPUs per node); when the whole
    world is smaller than one group, the group is the world (``min(shard_size, N)``).
    """
    _check(preset, world_sizes, strategies, precision, optimizer, phase, shard_size,
           activation_bytes, gpus_gb)
    p = presets()[preset]
    kw = dict(precision=precision, optimizer=optimizer, phase=phase,
              largest_unit_params=p.largest_unit, activation_bytes=float(activation_bytes))
    frames = []
    for n in world_sizes:
        bars = tuple(_bar(p.num_params, n, s, shard_size, tuple(gpus_gb), kw) for s in strategies)
        title = (f"{p.label} · {_count(p.num_params)} tham số · N = {n} GPU · {precision} · "
                 f"{optimizer} · {phase}")
        head = "N = 1: một GPU, mọi chiến lược như nhau. " if n == 1 else f"N = {n}: "
        caption = head + _grouped(bars, gpus_gb) + "."
        frames.append(LedgerFrame(title, n, bars, tuple(gpus_gb), caption))
    return frames


def _bar(num_params, n, strategy, shard_size, gpus_gb, kw) -> Bar:
    s = min(shard_size, n) if strategy == "HYBRID_SHARD" else None
    led = vram_ledger(num_params, n, strategy, shard_size=s, **kw)
    note = f"nhóm shard {s}" if s else NOTES[strategy]
    return Bar(strategy, note, led, fits(led.total, gpus_gb), s)


def _check(preset, world_sizes, strategies, precision, optimizer, phase, shard_size,
           activation_bytes, gpus_gb) -> None:
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
    for g in gpus_gb:
        if isinstance(g, bool) or not isinstance(g, (int, float)) or g <= 0:
            raise ValueError(f"dung lượng GPU phải là số GB dương, nhận được {g!r}.")


# ---------------------------------------------------------------- the renderer (SVG)

W, PLOT_X0, PLOT_X1, PLOT_Y0, PLOT_Y1 = 1000, 105, 925, 100, 410


def axis_top(frames: list[LedgerFrame]) -> float:
    """One y-axis for all frames, so bars visibly shrink from frame to frame. When bars dwarf
    the GPUs (70B on one GPU), the axis stops a little above the largest GPU and the taller
    bars are drawn broken, with their total written on top."""
    tallest = max(b.ledger.total for f in frames for b in f.bars)
    gpus = max((g for f in frames for g in f.gpus_gb), default=0) * GB
    if gpus and tallest > 1.3 * gpus:
        tallest = 1.15 * gpus
    return _nice(max(tallest, 1.0) * 1.05)


def _nice(x: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k not below ``x``."""
    k = 10 ** (len(str(int(x))) - 1) if x >= 1 else 1
    return next(m * k for m in (1, 2, 2.5, 5, 10) if m * k >= x)


def render(frame: LedgerFrame, top: float | None = None) -> str:
    """The frame as SVG: legend, stacked bars, GPU lines, fit table."""
    top = top or axis_top([frame])
    slot = (PLOT_X1 - PLOT_X0) / len(frame.bars)
    labels = _labels_height(frame.bars, slot)
    table_y = PLOT_Y1 + labels + 26
    svg = Svg(W, table_y + 30 * len(frame.gpus_gb) + 6, frame.title)
    svg.text(W / 2, 24, frame.title, cls="t-big", weight="bold")
    _legend(svg, any(b.ledger.activations for b in frame.bars))
    _axis(svg, top)
    for i, bar in enumerate(frame.bars):
        _draw_bar(svg, bar, PLOT_X0 + slot * (i + 0.5), min(0.6 * slot, 90), top)
    _bar_labels(svg, frame.bars, slot)
    _gpu_lines(svg, frame.gpus_gb, top)
    _fit_table(svg, frame, slot, table_y)
    return svg.render()


def _y(value: float, top: float) -> float:
    return PLOT_Y1 - (PLOT_Y1 - PLOT_Y0) * min(value, top) / top


def _legend(svg: Svg, activations: bool) -> None:
    kinds = KINDS if activations else KINDS[:3]
    widths = [60 + 8 * len(label) for _, label, _ in kinds]  # swatch, text, gap
    x = (W - sum(widths)) / 2
    for (_, label, colour), w in zip(kinds, widths):
        svg.rect(x, 46, 18, 18, fill=PALETTE[colour], stroke=PALETTE[colour])
        svg.text(x + 26, 56, label, cls="t", anchor="start")
        x += w


def _axis(svg: Svg, top: float) -> None:
    unit, scale = next((u, s) for u, s in (("GB", GB), ("MB", 1e6), ("KB", 1e3), ("B", 1))
                       if top >= 2 * s or s == 1)
    svg.text(8, PLOT_Y0 - 18, f"{unit} mỗi rank", cls="t-small", anchor="start")
    svg.line(PLOT_X0, PLOT_Y0, PLOT_X0, PLOT_Y1)
    svg.line(PLOT_X0, PLOT_Y1, PLOT_X1, PLOT_Y1)
    for k in range(5):
        v = top * k / 4
        svg.line(PLOT_X0 - 5, _y(v, top), PLOT_X0, _y(v, top))
        svg.text(PLOT_X0 - 10, _y(v, top), _num(v / scale), cls="t-small", anchor="end")


def _draw_bar(svg: Svg, bar: Bar, cx: float, width: float, top: float) -> None:
    base = 0.0
    for field, _, colour in KINDS:
        value = getattr(bar.ledger, field)
        if value and base < top:
            y0, y1 = _y(base + value, top), _y(base, top)
            svg.rect(cx - width / 2, y0, width, y1 - y0, fill=PALETTE[colour],
                     stroke="#333333", rx=0, opacity=0.55 if bar.measured else 1.0)
        base += value
    clipped = bar.ledger.total > top
    if clipped:  # a white zigzag band says "this bar goes on far above the axis"
        y = PLOT_Y0 + 14
        svg.rect(cx - width / 2 - 2, y, width + 4, 9, fill="#FFFFFF", stroke="#FFFFFF", rx=0)
        svg.line(cx - width / 2, y, cx + width / 2, y - 5)
        svg.line(cx - width / 2, y + 14, cx + width / 2, y + 9)
    label = ("↑ " if clipped else "") + human(bar.ledger.total)
    svg.text(cx, _y(bar.ledger.total, top) - 12, label, cls="t-small", weight="bold")


def _staggered(bars, slot: float) -> bool:
    """Whether neighbouring names would touch at the presentation size (18 px, about 13 units
    per bold capital, 10 per lower-case letter): then every other bar's names go one row down."""
    return any(6.5 * (len(a.label) + len(b.label)) > slot or 5 * (len(a.note) + len(b.note)) > slot
               for a, b in zip(bars, bars[1:]))


def _labels_height(bars, slot: float) -> float:
    if any(b.group for b in bars):
        return 50
    return 84 if _staggered(bars, slot) else 44


def _bar_labels(svg: Svg, bars, slot: float) -> None:
    """Each bar's name (bold) and note under it; staggered in two rows when they would touch."""
    if any(b.group for b in bars):
        _group_labels(svg, bars, slot)
        return
    stagger = _staggered(bars, slot)
    for i, bar in enumerate(bars):
        cx = PLOT_X0 + slot * (i + 0.5)
        y = PLOT_Y1 + 20 + (40 if stagger and i % 2 else 0)
        if stagger and i % 2:  # a thin tick leads the eye from the lower row to its bar
            svg.line(cx, PLOT_Y1 + 4, cx, y - 11, stroke=PALETTE["grey"])
        svg.text(cx, y, bar.label, cls="t-small", weight="bold")
        svg.text(cx, y + 20, bar.note, cls="t-small")


def _group_labels(svg: Svg, bars, slot: float) -> None:
    """Short bar names on the first row, each group's name centred under its bars."""
    start = 0
    for i, bar in enumerate(bars):
        svg.text(PLOT_X0 + slot * (i + 0.5), PLOT_Y1 + 22, bar.label, cls="t-small")
        if i + 1 == len(bars) or bars[i + 1].group != bar.group:
            svg.text(PLOT_X0 + slot * (start + i + 1) / 2, PLOT_Y1 + 46, bar.group, cls="t",
                     weight="bold")
            start = i + 1


def _gpu_lines(svg: Svg, gpus_gb, top: float) -> None:
    for g in gpus_gb:
        if g * GB <= top:
            y = _y(g * GB, top)
            svg.line(PLOT_X0, y, PLOT_X1, y, stroke=PALETTE["vermillion"], dash="8 5")
            svg.text(PLOT_X1 + 6, y, f"{_num(g)} GB", cls="t-small", anchor="start",
                     fill=PALETTE["vermillion"])


def _fit_table(svg: Svg, frame: LedgerFrame, slot: float, y0: float) -> None:
    """Under each bar, one cell per GPU size: "✓ vừa" (green) or "✗ không" (vermillion)."""
    if frame.gpus_gb:
        svg.text(8, y0 - 22, "Vừa GPU?", cls="t-small", anchor="start", weight="bold")
    for r, g in enumerate(frame.gpus_gb):
        y = y0 + 30 * r
        svg.text(PLOT_X0 - 10, y, f"{_num(g)} GB", cls="t-small", anchor="end")
        for i, bar in enumerate(frame.bars):
            ok = bar.fits[r]
            colour = PALETTE["green" if ok else "vermillion"]
            w = min(0.85 * slot, 110)
            cx = PLOT_X0 + slot * (i + 0.5)
            svg.rect(cx - w / 2, y - 12, w, 24, fill=colour, stroke=colour, opacity=0.25)
            svg.text(cx, y, "✓ vừa" if ok else "✗ không", cls="t-small", fill="#111111")


# ---------------------------------------------------------------- player and live controls

def ledger_player(preset: str = "llama-7b", *, presentation: bool = False, **kwargs) -> Player:
    """The static player: one frame per world size (``kwargs`` go to ``ledger_frames``)."""
    frames = ledger_frames(preset, **kwargs)
    top = axis_top(frames)
    label = presets()[preset].label
    return Player([Frame(render(f, top), f.caption) for f in frames],
                  title=f"Sổ kế toán VRAM mỗi rank: {label}, N = "
                        + ", ".join(str(f.world_size) for f in frames),
                  presentation=presentation, interval_ms=1800)


def controls(preset: str = "llama-7b"):
    """Live ipywidgets (need a kernel): model, precision, optimizer, phase, strategies…"""
    import ipywidgets as w

    from .live import live

    def build(activation_gb, **values):
        return ledger_player(activation_bytes=activation_gb * GB, **values)

    dd = functools.partial(w.Dropdown, style={"description_width": "initial"})
    return live(
        build,
        preset=dd(options=[(p.label, k) for k, p in presets().items()], value=preset,
                  description="Mô hình"),
        precision=dd(options=PRECISIONS, value="mixed", description="Độ chính xác"),
        optimizer=dd(options=OPTIMIZERS, value="adam", description="Bộ tối ưu"),
        phase=dd(options=[("lúc nghỉ (rest)", "rest"), ("trong bước (step)", "step")],
                 value="step", description="Thời điểm"),
        shard_size=dd(options=(1, 2, 4, 8), value=8, description="shard_size (HYBRID)"),
        activation_gb=w.BoundedFloatText(0.0, min=0.0, max=10_000.0, step=1.0,
                                         description="Activation (GB)"),
        strategies=w.SelectMultiple(options=STRATEGIES, value=DEFAULT_STRATEGIES, rows=4,
                                    description="Chiến lược"),
        presentation=w.Checkbox(False, description="Trình chiếu"),
    )


# ---------------------------------------------------------------- measured against predicted

MEASURED = ("DDP", "NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")


def measured_parallel(strategy: str):
    """The ``train.Parallel`` that realises ``strategy`` in ``measure.measure_step``."""
    from ..train import Parallel

    one_of("strategy", strategy, MEASURED)
    return Parallel("ddp") if strategy == "DDP" else Parallel("fsdp1", strategy=strategy)


def compare(results: dict, world_size: int = 2) -> list[tuple[str, Ledger, Ledger]]:
    """``(strategy, predicted, measured)`` for each ``results[strategy]`` (rank 0's dict from
    ``measure_step``). ``measure_step`` reads the state right after ``optimizer.step()``, in
    fp32 with Adam: that is the ledger's ``phase="rest"``."""
    rows = []
    for strategy, r in results.items():
        one_of("strategy", strategy, MEASURED)
        predicted = vram_ledger(r["num_params"], world_size, strategy, precision="fp32",
                                optimizer="adam", phase="rest")
        st = r["state"]
        rows.append((strategy, predicted, Ledger(st.params, st.grads, st.optimizer)))
    return rows


def measured_frame(results: dict, world_size: int = 2) -> LedgerFrame:
    """Predicted and measured bars side by side (no GPU table: a few KB fit anywhere)."""
    bars = []
    for strategy, predicted, measured in compare(results, world_size):
        bars.append(Bar("dự đoán", "", predicted, (), group=strategy))
        bars.append(Bar("đo được", "", measured, (), group=strategy, measured=True))
    n = next(iter(results.values()))["num_params"]
    caption = (f"MLP nhỏ ({n} tham số), {world_size} process gloo, fp32, Adam, sau "
               "optimizer.step(): mỗi cặp cột là công thức (trái) và số byte đo trên rank 0 "
               "(phải).")
    return LedgerFrame(f"Đo được so với dự đoán: N = {world_size}, fp32, Adam", world_size,
                       tuple(bars), (), caption)


def measured_player(results: dict, world_size: int = 2, presentation: bool = False) -> Player:
    """One frame: ``measured_frame`` in the static player."""
    f = measured_frame(results, world_size)
    return Player([Frame(render(f), f.caption)], title=f.title, presentation=presentation)
