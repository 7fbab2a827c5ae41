"""One Ring AllReduce frame as SVG: the ranks' chunks, this step's messages, the bytes sent."""

from __future__ import annotations

from ... import costs, vi
from ...style import PALETTE
from ..svg import Svg
from .frames import RingFrame


def render(f: RingFrame) -> str:
    """One frame as SVG: ranks as rows of chunks, this step's messages as arrows, counters."""
    n = f.world_size
    row_h = min(70.0, 460.0 / n)
    box_w, box_h, x0, y0 = min(60.0, 440.0 / n), row_h * 0.62, 120.0, 70.0
    # below the grid: the legend (three rows, 85 units) and a margin
    svg = Svg(1000, y0 + n * row_h + 105, "Ring AllReduce, từng bước")
    svg.text(20, 25, _title(f), cls="t-big", anchor="start", weight="bold")
    for r in range(n):
        y = y0 + r * row_h
        svg.text(x0 - 15, y + box_h / 2, f"Rank {r}", anchor="end", weight="bold")
        for c in range(n):
            x = x0 + c * box_w
            sending = any(e.src == r and e.chunk == c for e in f.sends)
            fill = PALETTE["green"] if f.complete(r, c) else PALETTE["sky"]
            opacity = 0.85 if f.complete(r, c) else 0.25 + 0.6 * f.counts[r][c] / n
            svg.rect(x + 2, y, box_w - 4, box_h, fill=fill, opacity=opacity,
                     stroke=PALETTE["vermillion"] if sending else "#333333",
                     cls="arrow" if sending else "stroke")
            svg.text(x + box_w / 2, y + box_h / 2, vi.general(f.values[r][c]),
                     cls="t-small" if n > 5 else "t")
    for e in f.sends:
        _draw_send(svg, e, x0, y0, box_w, box_h, row_h, n)
    _legend(svg, x0, y0 + n * row_h + 20)
    _counters(svg, f, 640, y0)
    return svg.render()


def _title(f: RingFrame) -> str:
    names = {"start": "trạng thái ban đầu", "reduce-scatter": "pha 1: reduce-scatter",
             "all-gather": "pha 2: all-gather"}
    # No step number: the player's counter is the only one (two counters would disagree: the
    # ring counts its steps from 0, the player its frames from 1).
    return f"Ring AllReduce, N = {f.world_size}: {names[f.phase]}"


def _draw_send(svg, e, x0, y0, box_w, box_h, row_h, n) -> None:
    xc = x0 + e.chunk * box_w + box_w / 2
    top_src, top_dst = y0 + e.src * row_h, y0 + e.dst * row_h
    colour = PALETTE["vermillion"]
    if e.dst == e.src + 1:
        svg.arrow(xc, top_src + box_h + 1, xc, top_dst - 1, colour=colour, head=9)
        return
    # Wrap-around from the last rank to rank 0: around the left of the grid, dashed.
    left = x0 - 95
    bottom = top_src + box_h + 8
    svg.raw(f'<polyline points="{xc:.1f},{top_src + box_h:.1f} {xc:.1f},{bottom:.1f} '
            f'{left:.1f},{bottom:.1f} {left:.1f},{top_dst - 10:.1f} {xc:.1f},{top_dst - 10:.1f}" '
            f'fill="none" stroke="{colour}" class="arrow" stroke-dasharray="6 4"/>')
    svg.arrow(xc, top_dst - 10, xc, top_dst - 1, colour=colour, head=9)


def _legend(svg, x, y) -> None:
    items = [(PALETTE["sky"], 0.5, "đang cộng dồn (đậm dần theo số rank đã góp)"),
             (PALETTE["green"], 0.85, "đã đủ tổng của cả N rank")]
    for k, (colour, opacity, label) in enumerate(items):
        svg.rect(x, y + k * 28, 22, 18, fill=colour, opacity=opacity)
        svg.text(x + 32, y + k * 28 + 9, label, cls="t-small", anchor="start")
    svg.arrow(x, y + 65, x + 22, y + 65, colour=PALETTE["vermillion"], head=8)
    svg.text(x + 32, y + 65, "mảnh được gửi ở bước này", cls="t-small", anchor="start")


def _counters(svg, f: RingFrame, x, y) -> None:
    """Bytes sent per rank so far, against the ring total and the naive scheme's busiest rank."""
    n, s = f.world_size, f.nbytes
    ring_total = costs.ring_bytes("all_reduce", s, n)
    naive = costs.naive_all_reduce_bytes(s, n)
    width = 230.0
    scale = width / max(naive, ring_total)
    svg.text(x, y - 15, "Byte đã gửi (mỗi rank)", anchor="start", weight="bold")
    row = min(26.0, 300.0 / n)
    for r in range(n):
        yy = y + 5 + r * row
        svg.rect(x + 60, yy, ring_total * scale, row * 0.6, fill=PALETTE["light"], stroke="#999999")
        if f.sent[r] > 0:
            svg.rect(x + 60, yy, f.sent[r] * scale, row * 0.6, fill=PALETTE["orange"])
        svg.text(x + 50, yy + row * 0.3, f"r{r}", cls="t-small", anchor="end")
    yy = y + 25 + n * row
    svg.text(x, yy, "Ring, mỗi rank gửi tổng cộng", cls="t-small", anchor="start")
    svg.text(x, yy + 22, f"2(N−1)/N · n = {vi.nbytes(ring_total)}", cls="t-small",
             anchor="start", weight="bold")
    svg.rect(x + 60, yy + 36, ring_total * scale, 14, fill=PALETTE["orange"])
    svg.text(x, yy + 72, "Cách tập trung (gom về rank 0 rồi gửi trả):", cls="t-small",
             anchor="start")
    svg.text(x, yy + 94, f"rank 0 gửi (N−1) · n = {vi.nbytes(naive)}", cls="t-small",
             anchor="start", weight="bold")
    svg.rect(x + 60, yy + 108, naive * scale, 14, fill=PALETTE["blue"])
