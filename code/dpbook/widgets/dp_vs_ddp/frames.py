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

The SVG renderer is ``widgets.dp_vs_ddp.render``; the player and the live controls are in the
package's ``__init__``."""

from __future__ import annotations

from dataclasses import dataclass

from ... import vi
from ...checks import int_at_least, non_negative
from ...costs import naive_all_reduce_bytes, ring_bytes

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
        dp.side(f"GPU 0 gửi bản sao mô hình ({vi.nbytes(m)}) cho từng GPU, mọi vòng lặp",
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
        dp.side(f"Các GPU gửi gradient ({vi.nbytes(m)}) về GPU 0 để cộng (reduce)",
                ["cộng"] + ["gửi"] * (n - 1), ["comm"] * n,
                [Transfer(j, 0, m, "gradient") for j in range(1, n)]),
        ddp.side(f"AllReduce bucket {b}: phần duy nhất không được backward che", ["AllReduce"] * n,
                 ["comm"] * n,
                 [Transfer(j, (j + 1) % n, ring, f"AllReduce bucket {b}") for j in range(n)]),
        f"DP: GPU 0 nhận {n - 1} bản gradient đầy đủ, lưu lượng tăng theo N. DDP: Ring AllReduce, "
        f"mỗi GPU gửi 2(N-1)/N bucket, gần như không đổi khi N tăng."))
    return steps
