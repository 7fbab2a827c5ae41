"""Ring AllReduce, step by step: frames from ``dpbook.collectives``' trace, drawn as SVG.

Each rank's buffer is drawn as N chunks. Rank r starts with value (r+1)(c+1) in chunk c, so
every final chunk reads (c+1) N(N+1)/2 and a lecturer can check the sums by eye. The
simulation runs twice: once on those values, once on all-ones buffers, whose running sums
count how many ranks' contributions each chunk already holds (N means complete).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import collectives, costs, vi
from ..checks import int_at_least, non_negative
from .player import Frame, Player
from ..style import PALETTE
from .svg import Svg

MAX_RANKS = 8


@dataclass(frozen=True)
class RingFrame:
    """The state after ``step`` steps (0: before the first message)."""

    world_size: int
    step: int
    phase: str  # "start", "reduce-scatter", "all-gather"
    phase_step: int  # 1-based within the phase, 0 at the start
    values: tuple[tuple[float, ...], ...]  # [rank][chunk]
    counts: tuple[tuple[int, ...], ...]  # contributions summed into [rank][chunk]
    sends: tuple[collectives.Event, ...]  # messages of this step
    sent: tuple[float, ...]  # cumulative bytes sent by each rank
    received: tuple[float, ...]
    nbytes: float  # size of the whole buffer being all-reduced

    def complete(self, rank: int, chunk: int) -> bool:
        return self.counts[rank][chunk] == self.world_size


def ring_inputs(world_size: int) -> list[torch.Tensor]:
    """Rank r holds (r+1)(c+1) in chunk c: one element per chunk, float64 for exact sums."""
    n = world_size
    return [torch.tensor([(r + 1.0) * (c + 1) for c in range(n)], dtype=torch.float64)
            for r in range(n)]


def ring_frames(world_size: int = 4, nbytes: float = 100e6) -> list[RingFrame]:
    """All 2(N-1)+1 states of a ring AllReduce of a ``nbytes`` buffer on ``world_size`` ranks."""
    int_at_least("world_size", world_size, 2)
    if world_size > MAX_RANKS:
        raise ValueError(f"world_size tối đa là {MAX_RANKS} để hình còn đọc được, "
                         f"nhận được {world_size}.")
    non_negative("nbytes", nbytes)
    n = world_size
    values = collectives.all_reduce(ring_inputs(n), record_states=True)
    counts = collectives.all_reduce([torch.ones(n, dtype=torch.float64)] * n, record_states=True)
    scale = nbytes / n / values.events[0].nbytes  # the simulator moves one element per chunk
    frames, sent, received = [], [0.0] * n, [0.0] * n
    for k, (state, count) in enumerate(zip(values.states, counts.states)):
        phase, phase_step = "start", 0
        sends: tuple = ()
        if k > 0:
            phase = "reduce-scatter" if k <= n - 1 else "all-gather"
            phase_step = k if k <= n - 1 else k - (n - 1)
            sends = tuple(e for e in values.events if e.phase == phase and e.step == phase_step - 1)
            for e in sends:
                sent[e.src] += e.nbytes * scale
                received[e.dst] += e.nbytes * scale
        frames.append(RingFrame(
            n, k, phase, phase_step,
            tuple(tuple(float(v) for v in row) for row in state),
            tuple(tuple(int(v) for v in row) for row in count),
            sends, tuple(sent), tuple(received), float(nbytes)))
    return frames


def caption(f: RingFrame) -> str:
    n = f.world_size
    if f.phase == "start":
        return (f"Ban đầu: mỗi rank chia bộ đệm {vi.nbytes(f.nbytes)} thành {n} mảnh; rank r giữ "
                f"giá trị (r+1)(c+1) ở mảnh c. Chưa byte nào được gửi.")
    if f.phase == "reduce-scatter":
        text = (f"Reduce-scatter, bước {f.phase_step}/{n - 1}: rank r gửi mảnh (r − {f.phase_step - 1})"
                f" mod {n} cho rank r+1, rank nhận cộng vào mảnh của mình.")
        if f.phase_step == n - 1:
            text += " Xong pha đầu: mỗi rank giữ trọn tổng của đúng một mảnh (màu xanh lá)."
        return text
    text = (f"All-gather, bước {f.phase_step}/{n - 1}: rank r chuyển tiếp mảnh đã hoàn chỉnh cho "
            f"rank r+1, rank nhận ghi đè bản cũ.")
    if f.phase_step == n - 1:
        text += (f" Xong: mọi rank có đủ tổng; mỗi rank đã gửi 2({n}−1)/{n} × "
                 f"{vi.nbytes(f.nbytes)} = {vi.nbytes(f.sent[0])} và nhận bấy nhiêu.")
    return text


def render(f: RingFrame) -> str:
    """One frame as SVG: ranks as rows of chunks, this step's messages as arrows, counters."""
    n = f.world_size
    row_h = min(70.0, 460.0 / n)
    box_w, box_h, x0, y0 = min(60.0, 440.0 / n), row_h * 0.62, 120.0, 70.0
    svg = Svg(1000, y0 + n * row_h + 150, "Ring AllReduce, từng bước")
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
            svg.text(x + box_w / 2, y + box_h / 2, f"{f.values[r][c]:g}",
                     cls="t-small" if n > 5 else "t")
    for e in f.sends:
        _draw_send(svg, e, x0, y0, box_w, box_h, row_h, n)
    _legend(svg, x0, y0 + n * row_h + 20)
    _counters(svg, f, 640, y0)
    return svg.render()


def _title(f: RingFrame) -> str:
    names = {"start": "trạng thái ban đầu", "reduce-scatter": "pha 1: reduce-scatter",
             "all-gather": "pha 2: all-gather"}
    return f"Ring AllReduce, N = {f.world_size}: bước {f.step}/{2 * (f.world_size - 1)} ({names[f.phase]})"


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
    svg.text(x, yy + 22, f"2(N−1)/N · S = {vi.nbytes(ring_total)}", cls="t-small",
             anchor="start", weight="bold")
    svg.rect(x + 60, yy + 36, ring_total * scale, 14, fill=PALETTE["orange"])
    svg.text(x, yy + 72, "Ngây thơ (gom về rank 0 rồi gửi trả):", cls="t-small", anchor="start")
    svg.text(x, yy + 94, f"rank 0 gửi (N−1) · S = {vi.nbytes(naive)}", cls="t-small",
             anchor="start", weight="bold")
    svg.rect(x + 60, yy + 108, naive * scale, 14, fill=PALETTE["blue"])


def ring_player(world_size: int = 4, nbytes: float = 100e6, presentation: bool = False) -> Player:
    frames = [Frame(render(f), caption(f)) for f in ring_frames(world_size, nbytes)]
    return Player(frames, f"Ring AllReduce với {world_size} rank", presentation=presentation)


def controls():
    """Live controls (need a kernel): number of ranks, buffer size, presentation mode."""
    import ipywidgets as w

    from .live import live

    return live(
        lambda world_size, megabytes, presentation: ring_player(world_size, megabytes * 1e6,
                                                                presentation),
        world_size=w.IntSlider(value=4, min=2, max=MAX_RANKS, description="Số rank"),
        megabytes=w.FloatLogSlider(value=100, base=10, min=0, max=4, description="Bộ đệm (MB)"),
        presentation=w.Checkbox(value=False, description="Trình chiếu"),
    )
