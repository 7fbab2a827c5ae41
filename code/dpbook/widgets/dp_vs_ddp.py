"""DataParallel against DistributedDataParallel: one training iteration on N GPUs, step by step.

Model (pure data, ``iteration_steps``): a list of ``Step``s, each with what the DP side and the
DDP side do, as ``Side``s: a word per GPU, which GPUs compute or move data, which ``Transfer``s
run (source, destination, bytes) and the bytes each GPU has sent and received so far. The steps
of the two sides are aligned by purpose (data, model, forward, loss, backward, gradients,
update), so a step where one side has nothing to do shows it idle: that is the point.

Traffic model (bytes in and out of each GPU's memory over PCIe/NVLink in one iteration), with
M the model bytes (parameters = gradients, same dtype), X the input batch bytes, O the output
bytes, N GPUs:

* DP, as ``torch.nn.DataParallel`` does it with the batch first moved to ``cuda:0``:
  the batch host -> GPU 0 (X), scatter (N-1)/N X out of GPU 0, replicate the model to every
  other GPU ((N-1) M out, *every* iteration), gather the outputs ((N-1)/N O in), send the
  outputs' gradients back ((N-1)/N O out), reduce the gradients onto GPU 0 ((N-1) M in).
  GPU 0: X (2N-1)/N + 2 (N-1) M + 2 (N-1)/N O; any other GPU: X/N + 2 M + 2 O/N.
  The two (N-1) M terms are ``costs.naive_all_reduce_bytes``: gradients to one GPU and the
  model back out of it, which is what DP does, spread over the next iteration's replicate.
* DDP: each process copies its X/N from the host, then ring AllReduce of the gradients in
  buckets: every GPU sends ``costs.ring_bytes("all_reduce", M, N)`` = 2 (N-1)/N M and receives
  as much. Every GPU: X/N + 4 (N-1)/N M, the same for all, and bounded by X/N + 4 M.

The GIL is drawn as one lock that DP's threads take in turn for the Python side of forward
(module calls, kernel launches): in forward step k thread k holds it and GPUs 0..k have work.
That is a picture, not a timing: real threads swap the GIL every few milliseconds. Backward runs
in autograd's C++ threads, which release the GIL.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from ..checks import int_at_least, non_negative
from ..costs import naive_all_reduce_bytes, ring_bytes
from .ledger import human
from .player import Frame, Player
from .svg import PALETTE, Svg

HOST = -1  # the CPU's memory, as a transfer endpoint
MAX_GPUS = 8
# ResNet-50 in fp32 at a batch of 64 ImageNet images: 25,557,032 parameters,
# 64 x 3 x 224 x 224 inputs, 64 x 1000 logits.
RESNET50_BYTES = 4 * 25_557_032
BATCH_BYTES = 4 * 64 * 3 * 224 * 224
OUTPUT_BYTES = 4 * 64 * 1000
STATES = ("compute", "comm", "idle")


@dataclass(frozen=True)
class Transfer:
    src: int  # GPU index, or HOST
    dst: int
    nbytes: float
    what: str


@dataclass(frozen=True)
class Side:
    """One side (DP or DDP) in one step; ``sent``/``received`` are cumulative per GPU."""

    summary: str
    activity: tuple[str, ...]
    state: tuple[str, ...]  # one of STATES per GPU
    transfers: tuple[Transfer, ...]
    threads: tuple[str, ...]  # second line under each GPU: GIL state (DP) or "GIL riêng" (DDP)
    gil: int | None  # DP: the thread that holds the single GIL, if any
    sent: tuple[float, ...]
    received: tuple[float, ...]

    @property
    def traffic(self) -> tuple[float, ...]:
        """Bytes in + out of each GPU so far in this iteration."""
        return tuple(s + r for s, r in zip(self.sent, self.received))


@dataclass(frozen=True)
class Step:
    phase: str
    dp: Side
    ddp: Side
    caption: str


class _Tally:
    """Running sent/received counters of one side; ``side`` books a step's transfers."""

    def __init__(self, n: int):
        self.n, self.sent, self.received = n, [0.0] * n, [0.0] * n

    def side(self, summary, activity, state, transfers=(), threads=None, gil=None) -> Side:
        for t in transfers:
            if t.src != HOST:
                self.sent[t.src] += t.nbytes
            if t.dst != HOST:
                self.received[t.dst] += t.nbytes
        threads = threads or ("",) * self.n
        return Side(summary, tuple(activity), tuple(state), tuple(transfers), tuple(threads),
                    gil, tuple(self.sent), tuple(self.received))


def traffic_totals(world_size: int = 4, model_bytes: float = RESNET50_BYTES,
                   input_bytes: float = BATCH_BYTES, output_bytes: float = OUTPUT_BYTES) -> dict:
    """The closed forms of the module docstring: bytes in + out of one GPU per iteration."""
    n, m, x, o = world_size, model_bytes, input_bytes, output_bytes
    return {
        "dp_gpu0": x * (2 * n - 1) / n + 2 * naive_all_reduce_bytes(m, n) + 2 * o * (n - 1) / n,
        "dp_other": x / n + 2 * m + 2 * o / n,
        "ddp": x / n + 2 * ring_bytes("all_reduce", m, n),
    }


def _check(world_size, model_bytes, input_bytes, output_bytes, buckets) -> None:
    int_at_least("world_size", world_size, 2)
    if world_size > MAX_GPUS:
        raise ValueError(f"world_size phải trong khoảng 2..{MAX_GPUS} (các GPU của một máy), "
                         f"nhận được {world_size!r}.")
    int_at_least("buckets", buckets)
    if buckets > 6:
        raise ValueError(f"buckets phải trong khoảng 1..6, nhận được {buckets!r}.")
    for name, value in (("model_bytes", model_bytes), ("input_bytes", input_bytes),
                        ("output_bytes", output_bytes)):
        non_negative(name, value)
    if model_bytes == 0:
        raise ValueError("model_bytes phải dương: mô hình không thể rỗng.")


def iteration_steps(world_size: int = 4, *, model_bytes: float = RESNET50_BYTES,
                    input_bytes: float = BATCH_BYTES, output_bytes: float = OUTPUT_BYTES,
                    buckets: int = 3) -> list[Step]:
    """One iteration of DP and of DDP, aligned step by step (``world_size + buckets + 6``)."""
    _check(world_size, model_bytes, input_bytes, output_bytes, buckets)
    n, m, x, o = world_size, model_bytes, input_bytes, output_bytes
    dp, ddp = _Tally(n), _Tally(n)
    others = range(1, n)
    steps = [Step(
        "Chia dữ liệu",
        dp.side("Batch lên GPU 0, rồi GPU 0 chia (scatter) cho các GPU khác",
                ["scatter"] + ["nhận"] * (n - 1), ["comm"] * n,
                [Transfer(HOST, 0, x, "batch")] + [Transfer(0, k, x / n, "mảnh batch")
                                                   for k in others]),
        ddp.side("Mỗi process tự nạp shard dữ liệu của mình (DistributedSampler)",
                 ["nạp"] * n, ["comm"] * n,
                 [Transfer(HOST, k, x / n, "shard dữ liệu") for k in range(n)]),
        "DP: cả batch đi qua GPU 0 trước, rồi mới được chia cho các GPU khác. DDP: mỗi process "
        "đọc phần dữ liệu riêng và chép thẳng lên GPU của nó.")]
    steps.append(Step(
        "Sao chép mô hình",
        dp.side(f"GPU 0 gửi bản sao mô hình ({human(m)}) cho từng GPU, mọi vòng lặp",
                ["gửi"] + ["nhận"] * (n - 1), ["comm"] * n,
                [Transfer(0, k, m, "bản sao mô hình") for k in others]),
        ddp.side("Không cần: mỗi process đã có bản sao từ lúc tạo DDP", ["—"] * n,
                 ["idle"] * n),
        "DP sao chép (replicate) mô hình từ GPU 0 sang mọi GPU ở MỖI vòng lặp, vì chỉ bản trên "
        "GPU 0 được cập nhật. DDP chỉ Broadcast tham số một lần khi khởi tạo."))
    steps += [_forward_step(dp, ddp, n, k) for k in range(n)]
    steps += _loss_steps(dp, ddp, n, o)
    steps += _backward_steps(dp, ddp, n, m, o, buckets)
    steps.append(Step(
        "Cập nhật tham số",
        dp.side("Chỉ GPU 0 chạy optimizer.step(); các GPU khác chờ", ["step"] + ["chờ"] * (n - 1),
                ["compute"] + ["idle"] * (n - 1)),
        ddp.side("Mỗi process tự chạy optimizer.step() với cùng gradient", ["step"] * n,
                 ["compute"] * n),
        "DP: chỉ GPU 0 giữ tham số thật và trạng thái bộ tối ưu; vòng sau lại phải sao chép mô "
        "hình. DDP: mọi process cập nhật cùng một gradient nên các bản sao vẫn giống hệt nhau."))
    return steps


def _forward_step(dp: _Tally, ddp: _Tally, n: int, k: int) -> Step:
    """Forward while DP's thread ``k`` holds the GIL: GPUs 0..k have work, the rest wait."""
    threads = ["giữ GIL" if j == k else "chờ GIL" for j in range(n)]
    return Step(
        f"Lan truyền xuôi (luồng {k} giữ GIL)",
        dp.side(f"Luồng {k} giữ GIL: chạy mã Python, phóng kernel; luồng khác chờ",
                ["forward" if j <= k else "chờ" for j in range(n)],
                ["compute" if j <= k else "idle" for j in range(n)], threads=threads, gil=k),
        ddp.side(f"{n} process chạy forward song song thật sự", ["forward"] * n,
                 ["compute"] * n, threads=["GIL riêng"] * n),
        f"DP: {n} luồng của MỘT process lần lượt giành một GIL chung; GPU {k} chỉ có việc khi "
        f"luồng {k} được chạy. DDP: mỗi process có trình thông dịch và GIL riêng.")


def _loss_steps(dp: _Tally, ddp: _Tally, n: int, o: float) -> list[Step]:
    gather = Step(
        "Gom đầu ra",
        dp.side("Các GPU gửi đầu ra về GPU 0 (gather)", ["nhận"] + ["gửi"] * (n - 1),
                ["comm"] * n, [Transfer(k, 0, o / n, "đầu ra") for k in range(1, n)]),
        ddp.side("Không cần: đầu ra ở lại GPU của mỗi process", ["—"] * n, ["idle"] * n),
        "DP gom (gather) đầu ra của mọi GPU về GPU 0 để tính loss ở một chỗ. DDP không gom gì.")
    loss = Step(
        "Tính loss",
        dp.side("Chỉ GPU 0 tính loss trên cả batch; các GPU khác chờ",
                ["loss"] + ["chờ"] * (n - 1), ["compute"] + ["idle"] * (n - 1)),
        ddp.side("Mỗi process tính loss trên shard của mình", ["loss"] * n, ["compute"] * n),
        "DP: loss của cả batch nằm trên GPU 0. DDP: mỗi process có loss của riêng nó; "
        "phép cộng gradient ở bước sau làm kết quả giống như tính trên cả batch.")
    return [gather, loss]


def _backward_steps(dp: _Tally, ddp: _Tally, n: int, m: float, o: float, b: int) -> list[Step]:
    """``b`` backward steps (DDP's bucket k-1 is all-reduced while bucket k is computed), then
    DP's gradient reduction next to DDP's last AllReduce, the only one not overlapped."""
    ring = ring_bytes("all_reduce", m / b, n)  # what each GPU sends for one bucket
    steps = []
    for k in range(b):
        out_grads = [Transfer(0, j, o / n, "grad đầu ra") for j in range(1, n)] if k == 0 else []
        dp_text = ("GPU 0 gửi gradient của đầu ra về từng GPU; backward trên mọi GPU" if k == 0
                   else "Backward tiếp trên mọi GPU (autograd chạy trong C++, nhả GIL)")
        ar = [Transfer(j, (j + 1) % n, ring, f"AllReduce bucket {k}")
              for j in range(n)] if k else []
        ddp_text = (f"Backward tính gradient của bucket {k + 1}" if k == 0 else
                    f"Backward bucket {k + 1}, song song AllReduce bucket {k}")
        steps.append(Step(
            f"Lan truyền ngược ({k + 1}/{b})",
            dp.side(dp_text, ["backward"] * n, ["compute"] * n, out_grads),
            ddp.side(ddp_text, ["backward"] * n, ["compute"] * n, ar),
            ("DP: gradient của đầu ra đi ngược đường gather, từ GPU 0 về từng GPU. " if k == 0
             else "DP chưa gửi gradient nào. ")
            + ("DDP: bucket nào đủ gradient thì được AllReduce ngay, trong khi backward tính "
               "tiếp các tầng phía trước (overlap)." if b > 1 else
               "DDP: chỉ một bucket, AllReduce phải chờ backward xong.")))
    steps.append(Step(
        "Cộng gradient",
        dp.side(f"Các GPU gửi gradient ({human(m)}) về GPU 0 để cộng (reduce)",
                ["cộng"] + ["gửi"] * (n - 1), ["comm"] * n,
                [Transfer(j, 0, m, "gradient") for j in range(1, n)]),
        ddp.side(f"AllReduce bucket {b}: phần duy nhất không được backward che", ["AllReduce"] * n,
                 ["comm"] * n,
                 [Transfer(j, (j + 1) % n, ring, f"AllReduce bucket {b}") for j in range(n)]),
        f"DP: GPU 0 nhận {n - 1} bản gradient đầy đủ, lưu lượng tăng theo N. DDP: Ring AllReduce, "
        f"mỗi GPU gửi 2(N-1)/N bucket, gần như không đổi khi N tăng."))
    return steps


# ---------------------------------------------------------------- the renderer (SVG)

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
    svg.text(W / 2, 22, f"Bước {index + 1}/{total} · {step.phase}", cls="t-big", weight="bold")
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
    """Group transfers by what they move; draw each group as its pattern: a short arrow from
    the host to GPU 0, a fan-out or fan-in over a rail above the GPUs, or a ring."""
    groups: dict[str, list[Transfer]] = {}
    for t in transfers:
        groups.setdefault(t.what, []).append(t)
    centre = lambda k: 54 if k == HOST else _box(n, k)[0] + _box(n, k)[1] / 2  # noqa: E731
    rail = py + 80
    for what, ts in groups.items():
        if len(ts) == 1 and ts[0].src == HOST and ts[0].dst == 0:
            svg.arrow(91, py + 160, ROW_X0 - 1, py + 160, colour=PALETTE["black"], head=9)
            svg.text(54, py + 192, what, cls="t-small", weight="bold")
            svg.text(54, py + 211, human(ts[0].nbytes), cls="t-small")
            continue
        srcs, dsts = {t.src for t in ts}, {t.dst for t in ts}
        label = f"{what}: " + (f"mỗi GPU gửi {human(ts[0].nbytes)} cho GPU kế tiếp (vòng)"
                               if len(srcs) == len(ts) == n and len(dsts) == n else
                               f"{human(ts[0].nbytes)}" + (" mỗi GPU" if len(ts) > 1 else ""))
        if len(srcs) == 1 or len(dsts) == 1:
            ends = [centre(k) for k in srcs | dsts]
            svg.line(min(ends), rail, max(ends), rail, stroke=PALETTE["blue"], cls="stroke arrow")
            for k in srcs:
                svg.line(centre(k), py + 100, centre(k), rail, stroke=PALETTE["blue"],
                         cls="stroke arrow")
            for k in dsts:
                svg.arrow(centre(k), rail, centre(k), py + 99, colour=PALETTE["blue"], head=11)
            svg.text((min(ends) + max(ends)) / 2, rail - 14, label, cls="t-small",
                     fill=PALETTE["blue"], weight="bold")
        else:
            _ring(svg, py, n, label)


def _ring(svg: Svg, py: float, n: int, label: str) -> None:
    for k in range(n - 1):
        x, w = _box(n, k)
        svg.arrow(x + w - 9, py + 162, x + w + GAP + 10, py + 162, colour=PALETTE["vermillion"],
                  head=9)
    last_x, last_w = _box(n, n - 1)
    first_x, first_w = _box(n, 0)
    y = py + 244
    svg.line(last_x + last_w / 2, py + 222, last_x + last_w / 2, y,
             stroke=PALETTE["vermillion"], cls="stroke arrow")
    svg.line(last_x + last_w / 2, y, first_x + first_w / 2, y, stroke=PALETTE["vermillion"],
             cls="stroke arrow")
    svg.arrow(first_x + first_w / 2, y, first_x + first_w / 2, py + 224,
              colour=PALETTE["vermillion"], head=11)
    svg.text((ROW_X0 + ROW_X1) / 2, y + 18, label, cls="t-small",
             fill=PALETTE["vermillion"], weight="bold")


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
        svg.text(913, y + row / 2, human(value) if value else "0", cls="t-small", anchor="start")


# ---------------------------------------------------------------- player and live controls

def dp_vs_ddp_player(world_size: int = 4, *, presentation: bool = False, **sizes) -> Player:
    """The static player over ``iteration_steps(world_size, **sizes)``."""
    steps = iteration_steps(world_size, **sizes)
    top = max(max(s.dp.traffic + s.ddp.traffic) for s in steps)
    frames = [Frame(render(s, i, len(steps), top), f"{s.phase}. {s.caption} Qua GPU 0 đến giờ: "
                    f"DP {human(s.dp.traffic[0])}, DDP {human(s.ddp.traffic[0])}.")
              for i, s in enumerate(steps)]
    return Player(frames, title=f"DP và DDP: một vòng lặp trên {world_size} GPU",
                  presentation=presentation, interval_ms=2200)


def controls(world_size: int = 4):
    """Live ipywidgets (need a kernel): N, buckets, model/batch/output sizes in MB."""
    import ipywidgets as w

    from .live import live

    def build(model_mb, input_mb, output_mb, **values):
        return dp_vs_ddp_player(model_bytes=model_mb * 1e6, input_bytes=input_mb * 1e6,
                                output_bytes=output_mb * 1e6, **values)

    style = {"description_width": "initial"}
    mb = lambda v, d: w.BoundedFloatText(v / 1e6, min=0.0, max=1e6, step=1.0,  # noqa: E731
                                          description=d, style=style)
    return live(
        build,
        world_size=w.IntSlider(world_size, min=2, max=MAX_GPUS, description="Số GPU N",
                               style=style),
        buckets=w.IntSlider(3, min=1, max=6, description="Số bucket (DDP)", style=style),
        model_mb=mb(RESNET50_BYTES, "Mô hình (MB)"),
        input_mb=mb(BATCH_BYTES, "Batch (MB)"),
        output_mb=mb(OUTPUT_BYTES, "Đầu ra (MB)"),
        presentation=w.Checkbox(False, description="Trình chiếu"),
    )
