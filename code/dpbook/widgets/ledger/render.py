"""A VRAM-ledger frame as SVG: stacked bars per GPU (parameters, gradients, optimizer state,
DDP's bucket copy of the gradients, activations) against what PyTorch can allocate on each card (``memory.Card.usable_bytes``, in
GB of 10⁹ B like the bars), and the table of which card each fits.
"""

from __future__ import annotations

from ... import vi
from ...style import GB, KB, MB, PALETTE
from ..svg import Svg
from .frames import Bar, LedgerFrame

# The kinds of bytes, bottom to top in a bar: (Ledger field, legend label, palette colour).
KINDS = (("params", "tham số", "blue"), ("grads", "gradient", "orange"),
         ("optimizer", "trạng thái bộ tối ưu", "green"),
         ("buffers", "bộ đệm bucket của DDP", "sky"), ("activations", "activation", "purple"))
W, PLOT_X0, PLOT_X1, PLOT_Y0, PLOT_Y1 = 1000, 115, 900, 100, 410


def axis_top(frames: list[LedgerFrame]) -> float:
    """One y-axis for all frames, so bars visibly shrink from frame to frame. When bars dwarf
    the GPUs (70B on one GPU), the axis stops a little above the largest GPU and the taller
    bars are drawn broken, with their total written on top."""
    tallest = max(b.ledger.total for f in frames for b in f.bars)
    gpus = max((c.usable_bytes for f in frames for c in f.cards), default=0)
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
    svg = Svg(W, table_y + 30 * len(frame.cards) + 6, frame.title)
    svg.text(W / 2, 24, frame.title, cls="t-big", weight="bold")
    _legend(svg, {k for k in ("buffers", "activations")
                  if any(getattr(b.ledger, k) for b in frame.bars)})
    _axis(svg, top)
    for i, bar in enumerate(frame.bars):
        _draw_bar(svg, bar, PLOT_X0 + slot * (i + 0.5), min(0.6 * slot, 90), top)
    _bar_labels(svg, frame.bars, slot)
    _gpu_lines(svg, frame.cards, top)
    _fit_table(svg, frame, slot, table_y)
    return svg.render()


def _y(value: float, top: float) -> float:
    return PLOT_Y1 - (PLOT_Y1 - PLOT_Y0) * min(value, top) / top


def _legend(svg: Svg, shown: set[str]) -> None:
    """The state's three kinds always; the bucket copy and activations when a bar has them."""
    kinds = [k for k in KINDS if k[0] in ("params", "grads", "optimizer") or k[0] in shown]
    widths = [60 + 8 * len(label) for _, label, _ in kinds]  # swatch, text, gap
    x = (W - sum(widths)) / 2
    for (_, label, colour), w in zip(kinds, widths):
        svg.rect(x, 46, 18, 18, fill=PALETTE[colour], stroke=PALETTE[colour])
        svg.text(x + 26, 56, label, cls="t", anchor="start")
        x += w


def _axis(svg: Svg, top: float) -> None:
    unit, scale = next((u, s) for u, s in (("GB", GB), ("MB", MB), ("KB", KB), ("B", 1))
                       if top >= 2 * s or s == 1)
    svg.text(8, PLOT_Y0 - 18, f"{unit} mỗi rank", cls="t-small", anchor="start")
    svg.line(PLOT_X0, PLOT_Y0, PLOT_X0, PLOT_Y1)
    svg.line(PLOT_X0, PLOT_Y1, PLOT_X1, PLOT_Y1)
    for k in range(5):
        v = top * k / 4
        svg.line(PLOT_X0 - 5, _y(v, top), PLOT_X0, _y(v, top))
        svg.text(PLOT_X0 - 10, _y(v, top), vi.short(v / scale), cls="t-small", anchor="end")


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
    label = ("↑ " if clipped else "") + vi.nbytes(bar.ledger.total)
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


def _gpu_lines(svg: Svg, cards, top: float) -> None:
    """One dashed line per card at what PyTorch can allocate there; in the margin, the card's
    name above the line and that amount (GB) below it."""
    for c in cards:
        if c.usable_bytes <= top:
            y = _y(c.usable_bytes, top)
            svg.line(PLOT_X0, y, PLOT_X1, y, stroke=PALETTE["vermillion"], dash="8 5")
            svg.text(PLOT_X1 + 6, y - 9, c.name, cls="t-small", anchor="start",
                     fill=PALETTE["vermillion"])
            svg.text(PLOT_X1 + 6, y + 9, f"{vi.short(c.usable_bytes / GB)} GB", cls="t-small",
                     anchor="start", fill=PALETTE["vermillion"])


def _fit_table(svg: Svg, frame: LedgerFrame, slot: float, y0: float) -> None:
    """Under each bar, one cell per card: "✓ vừa" (green) or "✗ không" (vermillion)."""
    if frame.cards:
        svg.text(8, y0 - 22, "Vừa GPU?", cls="t-small", anchor="start", weight="bold")
    for r, c in enumerate(frame.cards):
        y = y0 + 30 * r
        svg.text(PLOT_X0 - 10, y, c.name, cls="t-small", anchor="end")
        for i, bar in enumerate(frame.bars):
            ok = bar.fits[r]
            colour = PALETTE["green" if ok else "vermillion"]
            w = min(0.85 * slot, 110)
            cx = PLOT_X0 + slot * (i + 0.5)
            svg.rect(cx - w / 2, y - 12, w, 24, fill=colour, stroke=colour, opacity=0.25)
            svg.text(cx, y, "✓ vừa" if ok else "✗ không", cls="t-small", fill="#111111")
