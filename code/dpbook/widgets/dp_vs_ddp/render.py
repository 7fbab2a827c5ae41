"""One step of the DP-against-DDP animation as SVG: two panels (DataParallel above, DDP
below), each GPU's state, the transfers of the step and the running traffic.
"""

from __future__ import annotations

import html

from ... import vi
from ...style import PALETTE
from ..svg import Svg
from .frames import HOST, STATES, Side, Step, Transfer

W, PANEL_H, ROW_X0, ROW_X1, GAP = 1000, 280, 108, 735, 8
STATE_FILL = {"compute": "green", "comm": "sky", "idle": "light"}
STATE_LABEL = {"compute": "tính toán", "comm": "truyền dữ liệu", "idle": "chờ / không làm gì"}


def _box(n: int, k: int) -> tuple[float, float]:
    """Left x and width of GPU ``k``'s box in a row of ``n``."""
    w = (ROW_X1 - ROW_X0 - GAP * (n - 1)) / n
    return ROW_X0 + k * (w + GAP), w


def render(step: Step, index: int, total: int, top: float) -> str:
    """Both sides of one step; ``top`` is the traffic scale shared by every step."""
    svg = Svg(W, 2 * PANEL_H + 100, f"Bước {index + 1}/{total}: {step.phase}")
    # the phase only: the player's counter numbers the frames (one counter, not two)
    svg.text(W / 2, 22, step.phase, cls="t-big", weight="bold")
    n = len(step.dp.activity)
    _panel(svg, 40, step.dp, f"DataParallel (DP): 1 process, {n} luồng, một GIL chung", "luồng",
           top)
    _panel(svg, 50 + PANEL_H, step.ddp, f"DistributedDataParallel (DDP): {n} process", "process",
           top)
    x = 130
    for state in STATES:
        svg.rect(x, 2 * PANEL_H + 72, 18, 18, fill=PALETTE[STATE_FILL[state]], stroke="#333333")
        svg.text(x + 26, 2 * PANEL_H + 81, STATE_LABEL[state], cls="t-small", anchor="start")
        x += 60 + 8 * len(STATE_LABEL[state])
    return svg.render()


def _panel(svg: Svg, py: float, side: Side, title: str, unit: str, top: float) -> None:
    n = len(side.activity)
    svg.rect(8, py, W - 16, PANEL_H, fill="none", stroke=PALETTE["grey"])
    svg.text(20, py + 18, title, cls="t", anchor="start", weight="bold")
    svg.text(20, py + 44, side.summary, cls="t", anchor="start")
    svg.rect(18, py + 100, 72, 75, fill=PALETTE["light"])
    svg.text(54, py + 128, "CPU", cls="t", weight="bold")
    svg.text(54, py + 150, "(host)", cls="t-small")
    for k in range(n):
        x, w = _box(n, k)
        svg.rect(x, py + 100, w, 75, fill=PALETTE[STATE_FILL[side.state[k]]],
                 opacity=0.55 if side.state[k] != "idle" else 1.0)
        svg.text(x + w / 2, py + 116, f"GPU {k}", cls="t-small", weight="bold")
        _fitted(svg, x + w / 2, py + 140, side.activity[k], w - 8)
        # narrow boxes (7-8 GPUs): "rank k" is shorter than "process k" and means the same
        name = "rank" if unit == "process" and w < 85 else unit
        svg.text(x + w / 2, py + 192, f"{name} {k}", cls="t-small")
        if side.threads[k]:
            held = k == side.gil
            svg.text(x + w / 2, py + 211, side.threads[k], cls="t-small",
                     weight="bold" if held else "normal",
                     fill="#111111" if held else "#555555")
    if side.gil is not None:
        _gil(svg, py, side.gil, n)
    _transfers(svg, py, side.transfers, n)
    _traffic(svg, py, side.traffic, top)


def _fitted(svg: Svg, x: float, y: float, text: str, width: float) -> None:
    """Small centred text that would overflow ``width`` at the presentation size (18 px, about
    9.5 units a character) is squeezed to ``width`` with SVG's ``textLength``."""
    if 9.5 * len(text) <= width:
        svg.text(x, y, text, cls="t-small")
        return
    svg.raw(f'<text x="{x:.1f}" y="{y:.1f}" class="t-small" text-anchor="middle" '
            f'dominant-baseline="middle" fill="#111111" textLength="{width:.1f}" '
            f'lengthAdjust="spacingAndGlyphs">{html.escape(text)}</text>')


def _gil(svg: Svg, py: float, holder: int, n: int) -> None:
    """The single lock, with a line to the thread that holds it."""
    svg.rect(8, py + 188, 92, 46, fill=PALETTE["yellow"], stroke="#333333")
    svg.text(54, py + 201, "GIL", cls="t-small", weight="bold")
    svg.text(54, py + 222, f"→ luồng {holder}", cls="t-small")
    x, w = _box(n, holder)
    svg.line(100, py + 236, x + w / 2, py + 236, stroke=PALETTE["black"], cls="stroke")
    svg.line(x + w / 2, py + 236, x + w / 2, py + 222, stroke=PALETTE["black"], cls="stroke")


def _transfers(svg: Svg, py: float, transfers, n: int) -> None:
    """Group transfers by what they move; draw each group as its pattern. Plain copies (blue):
    a short arrow from the host to GPU 0, or a fan-out or fan-in over a rail above the GPUs.
    Links of an NCCL collective (vermillion): arrows between neighbouring GPUs, a chain
    (Broadcast, Reduce) or a ring (AllReduce)."""
    groups: dict[str, list[Transfer]] = {}
    for t in transfers:
        groups.setdefault(t.what, []).append(t)
    centre = lambda k: 54 if k == HOST else _box(n, k)[0] + _box(n, k)[1] / 2  # noqa: E731
    rail = py + 80
    for what, ts in groups.items():
        size = vi.nbytes(ts[0].nbytes)
        if ts[0].kind == "nccl":
            ring = len(ts) == n
            label = (f"{what}: mỗi GPU gửi {size} cho GPU kế tiếp (vòng)" if ring else
                     f"{what}: chuỗi NCCL, {size} mỗi chặng")
            _links(svg, py, n, {(t.src, t.dst) for t in ts}, label)
            continue
        if len(ts) == 1 and ts[0].src == HOST and ts[0].dst == 0:
            svg.arrow(91, py + 160, ROW_X0 - 1, py + 160, colour=PALETTE["black"], head=9)
            svg.text(54, py + 192, what, cls="t-small", weight="bold")
            svg.text(54, py + 211, size, cls="t-small")
            continue
        srcs, dsts = {t.src for t in ts}, {t.dst for t in ts}
        label = f"{what}: {size}" + (" mỗi GPU" if len(ts) > 1 else "")
        ends = [centre(k) for k in srcs | dsts]
        svg.line(min(ends), rail, max(ends), rail, stroke=PALETTE["blue"], cls="stroke arrow")
        for k in srcs:
            svg.line(centre(k), py + 100, centre(k), rail, stroke=PALETTE["blue"],
                     cls="stroke arrow")
        for k in dsts:
            svg.arrow(centre(k), rail, centre(k), py + 99, colour=PALETTE["blue"], head=11)
        svg.text((min(ends) + max(ends)) / 2, rail - 14, label, cls="t-small",
                 fill=PALETTE["blue"], weight="bold")


def _links(svg: Svg, py: float, n: int, pairs: set, label: str) -> None:
    """Arrows k -> k+1 between neighbouring boxes for the pairs given, and the way back from
    the last GPU to GPU 0 under the row when ``(n-1, 0)`` is one of them."""
    colour = PALETTE["vermillion"]
    for k in range(n - 1):
        if (k, k + 1) in pairs:
            x, w = _box(n, k)
            svg.arrow(x + w - 9, py + 162, x + w + GAP + 10, py + 162, colour=colour, head=9)
    y = py + 244
    if (n - 1, 0) in pairs:
        last_x, last_w = _box(n, n - 1)
        first_x, first_w = _box(n, 0)
        svg.line(last_x + last_w / 2, py + 222, last_x + last_w / 2, y, stroke=colour,
                 cls="stroke arrow")
        svg.line(last_x + last_w / 2, y, first_x + first_w / 2, y, stroke=colour,
                 cls="stroke arrow")
        svg.arrow(first_x + first_w / 2, y, first_x + first_w / 2, py + 224, colour=colour,
                  head=11)
    svg.text((ROW_X0 + ROW_X1) / 2, y + 18, label, cls="t-small", fill=colour, weight="bold")


def _traffic(svg: Svg, py: float, traffic, top: float) -> None:
    """Cumulative bytes in + out of each GPU, on a scale shared by both panels and all steps."""
    n = len(traffic)
    svg.text(750, py + 18, "Lưu lượng vào + ra", cls="t-small", anchor="start", weight="bold")
    svg.text(750, py + 36, "mỗi GPU, đến bước này", cls="t-small", anchor="start")
    row = min(28.0, (PANEL_H - 56) / n)
    for k, value in enumerate(traffic):
        y = py + 48 + k * row
        svg.text(794, y + row / 2, f"GPU {k}", cls="t-small", anchor="end")
        svg.rect(800, y + 0.15 * row, 108, 0.7 * row, fill="none", stroke=PALETTE["grey"], rx=2)
        if value:
            svg.rect(800, y + 0.15 * row, 108 * value / top, 0.7 * row,
                     fill=PALETTE["orange" if k == 0 else "sky"], stroke="#333333", rx=2)
        svg.text(913, y + row / 2, vi.nbytes(value) if value else "0", cls="t-small", anchor="start")
