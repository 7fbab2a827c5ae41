"""A DDP-bucket frame as SVG: the buckets filling, the layers' backward and the AllReduces on a
time axis; and the three-strategy comparison.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from ... import vi
from ...overlap import CommSpan, Comparison, Timeline
from ...style import MIB, PALETTE
from ..svg import Svg
from .frames import EPS, StepFrame

_BUCKET_COLOURS = ("sky", "orange", "green", "purple", "yellow", "vermillion", "blue")
W, H = 1000, 600
X0, X1 = 185, 975  # time axis
Y_BUCKETS, Y_COMP, Y_COMM, Y_BASE, Y_AXIS = 96, 228, 318, 398, 470


def bucket_colour(k: int) -> str:
    return PALETTE[_BUCKET_COLOURS[k % len(_BUCKET_COLOURS)]]


def _ink(k: int) -> str:
    """Text colour on a bucket's fill: white only on the dark blue."""
    return "#FFFFFF" if _BUCKET_COLOURS[k % len(_BUCKET_COLOURS)] == "blue" else "#111111"


def render_frame(fr: StepFrame) -> str:
    tl = fr.timeline
    s = Svg(W, H, "Bucket của DDP và chồng lấp giao tiếp với backward")
    cap, first = tl.caps[1] / MIB, tl.caps[0] / MIB
    s.text(20, 26, _title(tl, cap, first), cls="t-big", anchor="start", weight="bold")
    colour = PALETTE["sky"] if tl.source == "alpha-beta" else PALETTE["orange"]
    s.rect(14, 42, 972, 28, fill=colour, stroke=colour, opacity=0.25)
    s.text(22, 57, tl.label, cls="t-small", anchor="start")
    _draw_buckets(s, fr)
    _draw_timeline(s, fr)
    _draw_summary(s, fr)
    return s.render()


def _title(tl: Timeline, cap: float, first: float) -> str:
    """The caps, and where the small one lands: on B0 once rebuilt, on the last bucket in the
    first iteration (packed from the parameters declared first, then reversed)."""
    text = f"DDP: bucket_cap_mb = {vi.number(cap, 2)} MiB"
    if tl.layout == "initial" and all(b.limit == sys.maxsize for b in tl.buckets):
        return text + "; bước 1: một bucket"
    if first != cap:
        where = "bucket cuối" if tl.layout == "initial" else "bucket đầu"
        text += f", {where} {vi.number(first, 2)} MiB"
    return text


def _fits(text: str, width: float, px: float = 11.0) -> bool:
    """Conservative: ``px`` per character is about presentation mode's 18 px small text."""
    return len(text) * px <= width - 6


def _draw_buckets(s: Svg, fr: StepFrame) -> None:
    tl = fr.timeline
    which = "bố cục bước 1" if tl.layout == "initial" else "bố cục đã dựng lại"
    s.text(20, Y_BUCKETS - 8, f"Bucket theo thứ tự AllReduce, {which} (phần tô = gradient đã có):",
           cls="t", anchor="start")
    words = {"empty": "trống", "filling": "đang gom", "waiting": "chờ", "reducing": "AllReduce",
             "done": "✓ xong"}
    for k, (x, w) in enumerate(_widths([b.nbytes for b in tl.buckets], 20, 980)):
        b, st, col = tl.buckets[k], fr.status[k], bucket_colour(k)
        frac = fr.filled[k] / b.nbytes if b.nbytes else 1.0
        strong = st in ("reducing", "done")
        s.rect(x, Y_BUCKETS + 4, w, 52, fill="#FFFFFF", stroke=col if frac else PALETTE["grey"])
        if frac:
            s.rect(x, Y_BUCKETS + 4, w * frac, 52, fill=col, stroke=col,
                   opacity=1.0 if strong else 0.45)
        ink = _ink(k) if strong else "#111111"
        head = next((t for t in (f"B{k} · {_kib(b.nbytes)}", f"B{k}") if _fits(t, w)), None)
        if head:
            s.text(x + w / 2, Y_BUCKETS + 20, head, cls="t-small", fill=ink)
        if _fits(words[st], w):
            s.text(x + w / 2, Y_BUCKETS + 42, words[st], cls="t-small", fill=ink)
        names = [tl.params[i].layer for i in b.params]
        span = names[0] if names[0] == names[-1] else f"{names[0]} → {names[-1]}"
        if _fits(span, w):  # which layers the bucket holds, in the order they arrive
            s.text(x + w / 2, Y_BUCKETS + 74, span, cls="t-small", fill="#333333")


def _widths(sizes: Sequence[int], left: float, right: float, gap: float = 4.0):
    """Boxes proportional to bytes, with a floor so that a 1 KiB bucket stays visible."""
    n = len(sizes)
    avail = right - left - gap * (n - 1)
    floor = min(56.0, 0.6 * avail / n)
    total = sum(sizes) or 1
    x = left
    for size in sizes:
        w = floor + (avail - floor * n) * size / total
        yield x, w
        x += w + gap


def _draw_timeline(s: Svg, fr: StepFrame) -> None:
    tl = fr.timeline
    scale = _scale(tl)
    for y, text in ((Y_COMP + 20, "Backward"), (Y_COMM + 20, "AllReduce")):
        s.text(15, y, text, cls="t", anchor="start", weight="bold")
    if tl.source == "measured":
        s.text(15, Y_COMM + 42, "(phát → xong)", cls="t-small", anchor="start")
    base_ink = "#111111" if fr.final else PALETTE["grey"]  # filled in on the last frame
    s.text(15, Y_BASE + 7, "Không", cls="t", anchor="start", weight="bold", fill=base_ink)
    s.text(15, Y_BASE + 33, "chồng lấp", cls="t", anchor="start", weight="bold", fill=base_ink)
    owner = {i: k for k, b in enumerate(tl.buckets) for i in b.params}
    for span in tl.layers:
        _draw_layer(s, span, scale, owner, tl, done=span.end <= fr.now + EPS)
    rows, h = _comm_rows(tl)
    for k, c in enumerate(tl.comms):
        _draw_comm(s, c, scale, fr.now, Y_COMM + (k % rows) * h, h * 0.9 if rows > 1 else h)
    if fr.final:
        _draw_baseline(s, tl, scale)
    _draw_axis(s, tl, scale)
    x = scale(fr.now)
    s.line(x, Y_COMP - 16, x, Y_AXIS, stroke=PALETTE["black"], dash="6 4")
    label = f"t = {vi.ms(fr.now)}"
    s.text(min(max(x, X0 + 60), X1 - 60), Y_COMP - 26, label, cls="t-small", weight="bold")


def _draw_layer(s, span, scale, owner, tl, done) -> None:
    x, w = scale(span.start), max(1.5, scale(span.end) - scale(span.start))
    s.rect(x, Y_COMP, w, 40, fill=PALETTE["light"] if done else "#FFFFFF",
           stroke=PALETTE["black"] if done else PALETTE["grey"], rx=2)
    if _fits(span.name, w, 9.5):
        s.text(x + w / 2, Y_COMP + 20, span.name, cls="t-small",
               fill="#111111" if done else "#666666")
    nb = sum(tl.params[i].nbytes for i in span.params) or 1
    px = x
    for i in span.params:  # the strip under the bar: which bucket each gradient goes to
        pw = w * tl.params[i].nbytes / nb
        if done:
            s.rect(px, Y_COMP + 44, pw, 12, fill=bucket_colour(owner[i]), stroke="none", rx=0)
        px += pw


def _draw_comm(s, c: CommSpan, scale, now: float, y: float, h: float) -> None:
    col = bucket_colour(c.bucket)
    if c.ready <= now + EPS:  # the bucket's last gradient has arrived
        xr = scale(c.ready)
        s.raw(f'<polygon points="{xr - 7:.1f},{Y_COMM - 14:.1f} {xr + 7:.1f},{Y_COMM - 14:.1f} '
              f'{xr:.1f},{Y_COMM - 2:.1f}" fill="{col}" stroke="#333333" stroke-width="1"/>')
        if c.start > c.ready + EPS:  # waiting for the link (model) or for the reducer (run)
            s.line(xr, y + h / 2, scale(min(c.start, now)), y + h / 2, stroke=col, dash="3 3")
    if c.start > now + EPS:
        return
    x, xe, xn = scale(c.start), scale(c.end), scale(min(c.end, now))
    s.rect(x, y, max(1.5, xe - x), h, fill="#FFFFFF", stroke=col, rx=2)
    s.rect(x, y, max(1.5, xn - x), h, fill=col, stroke=col, rx=2)
    label = f"B{c.bucket}"
    if h >= 18 and _fits(label, xe - x, 10):
        s.text((x + xe) / 2, y + h / 2, label, cls="t-small",
               fill=_ink(c.bucket) if xn >= xe - 1 else "#111111")


def _comm_rows(tl: Timeline) -> tuple[int, float]:
    """The model serialises AllReduces on one row; a measured run may overlap them (gloo runs
    queued work on several threads), so each bucket gets its own thin row there."""
    if tl.source == "alpha-beta":
        return 1, 40.0
    n = len(tl.comms)
    return n, min(40.0, 64.0 / n)


def _draw_baseline(s, tl: Timeline, scale) -> None:
    end = tl.compute_end if tl.baseline_compute_end is None else tl.baseline_compute_end
    xc, xe = scale(end), scale(tl.baseline_total)
    s.rect(X0, Y_BASE, xc - X0, 40, fill=PALETTE["light"], stroke=PALETTE["black"], rx=2)
    s.text((X0 + xc) / 2, Y_BASE + 20, "backward", cls="t-small")
    s.rect(xc, Y_BASE, max(1.5, xe - xc), 40, fill=PALETTE["vermillion"],
           stroke=PALETTE["vermillion"], rx=2)
    xl = max(xc, scale(tl.total) + 4)  # keep the label clear of the green "total" line
    if _fits("AllReduce", xe - xl, 10):
        s.text((xl + xe) / 2, Y_BASE + 20, "AllReduce", cls="t-small")
    for x, colour in ((scale(tl.total), PALETTE["green"]), (xe, PALETTE["vermillion"])):
        s.line(x, Y_COMP - 4, x, Y_AXIS, stroke=colour, cls="stroke arrow")


def _draw_axis(s, tl: Timeline, scale) -> None:
    s.line(X0, Y_AXIS, X1, Y_AXIS)
    span = _axis_end(tl)
    step = _nice_step(span / 6)
    t = 0.0
    while t <= span * 1.0001:
        x = scale(t)
        s.line(x, Y_AXIS, x, Y_AXIS + 6)
        s.text(x, Y_AXIS + 20, vi.number(t * 1e3, _decimals(step * 1e3)), cls="t-small")
        t += step
    s.text((X0 + X1) / 2, Y_AXIS + 44, "thời gian từ lúc bắt đầu backward (ms)", cls="t-small")


def _draw_summary(s, fr: StepFrame) -> None:
    tl = fr.timeline
    y = Y_AXIS + 80
    if not fr.final:
        s.text(20, y, f"{len(tl.buckets)} bucket · {len(tl.layers)} tầng · tổng gradient "
               f"{_kib(sum(p.nbytes for p in tl.params))} · ▼ = bucket đủ gradient",
               cls="t", anchor="start")
        return
    gain = tl.baseline_total - tl.total
    s.text(20, y, f"Có chồng lấp: {vi.ms(tl.total)}", cls="t", anchor="start", weight="bold",
           fill=PALETTE["green"])
    s.text(330, y, f"Không chồng lấp: {vi.ms(tl.baseline_total)}", cls="t", anchor="start",
           weight="bold", fill=PALETTE["vermillion"])
    word = "Nhanh hơn" if gain >= 0 else "Chậm hơn"
    s.text(680, y, f"{word}: {vi.ms(abs(gain))} ({vi.number(100 * abs(gain) / tl.baseline_total, 0)}%)",
           cls="t", anchor="start", weight="bold")


def _axis_end(tl: Timeline) -> float:
    return max(tl.total, tl.baseline_total) * 1.03


def _scale(tl: Timeline):
    end = _axis_end(tl)
    return lambda t: X0 + (X1 - X0) * t / end


def _nice_step(raw: float) -> float:
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _decimals(step_ms: float) -> int:
    return 0 if step_ms >= 1 else (1 if step_ms >= 0.1 else 2)


def _kib(n: int) -> str:
    return f"{vi.number(n / 1024, 1)} KiB"


COMPARISON_ROWS = 3


def comparison_svg(c: Comparison, shown: int = COMPARISON_ROWS) -> str:
    """Step time of the three ways, in the order the chapter teaches them (one AllReduce after
    backward, one per parameter, buckets); the first ``shown`` bars are drawn, on one scale, so
    that a build-up adds a bar per frame and nothing else moves."""
    if not 1 <= shown <= COMPARISON_ROWS:
        raise ValueError(f"shown phải từ 1 đến {COMPARISON_ROWS}, nhận được {shown!r}.")
    s = Svg(W, 270, "So sánh ba cách đồng bộ gradient")
    s.text(20, 26, "Vì sao gom gradient thành bucket?", cls="t-big", anchor="start",
           weight="bold")
    s.text(20, 56, c.label, cls="t-small", anchor="start")
    rows = (("1. Một AllReduce sau backward", c.no_overlap, PALETTE["vermillion"]),
            (f"2. Mỗi tham số một AllReduce ({c.n_per_param} lần)", c.per_param,
             PALETTE["purple"]),
            (f"3. Bucket {vi.number(c.cap / MIB, 2)} MiB ({c.n_buckets} lần)", c.buckets,
             PALETTE["green"]))
    end = max(r[1] for r in rows) * 1.2
    for k, (text, t, col) in enumerate(rows[:shown]):
        y = 84 + 58 * k
        s.text(20, y + 18, text, cls="t", anchor="start")
        w = 520 * t / end
        s.rect(440, y, w, 36, fill=col, stroke=col, rx=2)
        s.text(440 + w + 8, y + 18, vi.ms(t), cls="t", anchor="start", weight="bold")
    return s.render()
