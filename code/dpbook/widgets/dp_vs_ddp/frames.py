"""DataParallel against DistributedDataParallel: one training step on N GPUs, frame by frame.

Model (pure data, ``iteration_steps``): a list of ``Step``s, each with what the DP side and the
DDP side do, as ``Side``s: a word per GPU, which GPUs compute or move data, which ``Transfer``s
run (source, destination, bytes, and whether it is a plain copy or part of an NCCL collective)
and the bytes each GPU has sent and received so far. The steps of the two sides are aligned by
purpose (data, model, forward, loss, backward, gradients, update), so a step where one side has
nothing to do shows it idle: that is the point.

Traffic model (bytes in and out of each GPU's memory in one training step), with M the model
bytes (parameters = gradients, same dtype), X the input batch bytes, O the output bytes, N GPUs,
as torch does it when NCCL is available:

* DP (``torch.nn.DataParallel``, the batch first moved to ``cuda:0``). Scatter and gather are
  direct copies (``comm.scatter``/``comm.gather``: one ``.to``/``copy_`` per device): the batch
  host -> GPU 0 (X), (N-1)/N X out of GPU 0, the outputs back in ((N-1)/N O), the outputs'
  gradients out again ((N-1)/N O). Replicate is ``comm.broadcast_coalesced``, an NCCL Broadcast
  when NCCL is available, and the backward's ``ReduceAddCoalesced`` is ``comm.reduce_add``, an
  NCCL Reduce (``nccl.reduce``): both are pipelined chains (``costs.rooted_bytes``), every link
  carrying M once, GPU 0 sending M for the Broadcast and receiving M for the Reduce.
  GPU 0: X (2N-1)/N + 2 M + 2 (N-1)/N O; GPU 1 and GPU N-1: X/N + 3 M + 2 O/N (2 M when N = 2);
  the GPUs between them: X/N + 4 M + 2 O/N. Nothing grows with N but GPU 0's copies of X and O.
  Without NCCL the same calls fall back to one copy per GPU, a star through GPU 0
  (``route="star"``: GPU 0 sends and receives (N-1) M, ``costs.naive_all_reduce_bytes``).
* DDP: each process copies its X/N from the host, then ring AllReduce of the gradients in
  buckets: every GPU sends ``costs.ring_bytes("all_reduce", M, N)`` = 2 (N-1)/N M and receives
  as much. Every GPU: X/N + 4 (N-1)/N M, the same for all, and bounded by X/N + 4 M.

So the bytes of the model are about the same on both sides; what DP pays is elsewhere, and the
frames show it: one process whose threads share one GIL, the model re-broadcast before every
forward, the gradient Reduce only after the whole backward (no overlap), GPU 0 alone computing
the loss on the full outputs and running the optimizer.

The GIL is drawn as one lock that DP's threads take in turn for the Python side of forward
(module calls, kernel launches): in forward step k thread k holds it and GPUs 0..k have work.
That is a picture, not a timing: real threads swap the GIL every few milliseconds. Backward runs
in autograd's C++ threads, which release the GIL.

The SVG renderer is ``widgets.dp_vs_ddp.render``; the player and the live controls are in the
package's ``__init__``."""

from __future__ import annotations

from dataclasses import dataclass

from ... import vi
from ...checks import int_at_least, non_negative, one_of
from ...costs import ROUTES, ring_bytes, rooted_bytes, rooted_links

HOST = -1  # the CPU's memory, as a transfer endpoint
MAX_GPUS = 8
# ResNet-50 in fp32 at a batch of 64 ImageNet images: 25,557,032 parameters,
# 64 x 3 x 224 x 224 inputs, 64 x 1000 logits.
RESNET50_BYTES = 4 * 25_557_032
BATCH_BYTES = 4 * 64 * 3 * 224 * 224
OUTPUT_BYTES = 4 * 64 * 1000
STATES = ("compute", "comm", "idle")
KINDS = ("copy", "nccl")  # a plain copy (host or peer-to-peer), or a link of an NCCL collective


@dataclass(frozen=True)
class Transfer:
    src: int  # GPU index, or HOST
    dst: int
    nbytes: float
    what: str
    kind: str = "copy"  # one of KINDS


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
                   input_bytes: float = BATCH_BYTES, output_bytes: float = OUTPUT_BYTES, *,
                   route: str = "chain") -> dict[str, tuple[float, ...]]:
    """The closed forms of the module docstring: bytes in + out of each GPU in one step,
    ``{"dp": (GPU 0, GPU 1, ...), "ddp": (...)}``. ``route="chain"`` is DP with NCCL (what the
    frames draw), ``route="star"`` DP's fallback without NCCL."""
    _check(world_size, model_bytes, input_bytes, output_bytes, 1)
    one_of("route", route, ROUTES)
    n, m, x, o = world_size, model_bytes, input_bytes, output_bytes
    model = [b + r for b, r in zip(rooted_bytes("broadcast", m, n, route).traffic,
                                   rooted_bytes("reduce", m, n, route).traffic)]
    data = [x * (2 * n - 1) / n + 2 * o * (n - 1) / n] + [x / n + 2 * o / n] * (n - 1)
    return {"dp": tuple(d + b for d, b in zip(data, model)),
            "ddp": (x / n + 2 * ring_bytes("all_reduce", m, n),) * n}


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
    """One training step of DP and of DDP, aligned frame by frame (``world_size + buckets + 6``
    frames)."""
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
        dp.side(f"Broadcast mô hình ({vi.nbytes(m)}) theo chuỗi NCCL, ở mọi bước",
                ["gửi"] + ["nhận, gửi tiếp"] * (n - 2) + ["nhận"], ["comm"] * n,
                _chain(rooted_links("broadcast", n), m, "bản sao mô hình")),
        ddp.side("Không cần: mỗi process đã có bản sao từ lúc tạo DDP", ["—"] * n,
                 ["idle"] * n),
        "DP sao chép (replicate) mô hình từ GPU 0 sang mọi GPU ở MỖI bước, vì chỉ bản trên "
        "GPU 0 được cập nhật; comm.broadcast_coalesced dùng Broadcast của NCCL, chuyển mô hình "
        "theo chuỗi GPU kề nhau, nên GPU 0 chỉ gửi một bản. Forward phải chờ bước này xong. "
        "DDP chỉ Broadcast tham số một lần, khi khởi tạo."))
    steps += [_forward_step(dp, ddp, n, k) for k in range(n)]
    steps += _loss_steps(dp, ddp, n, o)
    steps += _backward_steps(dp, ddp, n, m, o, buckets)
    steps.append(Step(
        "Cập nhật tham số",
        dp.side("Chỉ GPU 0 chạy optimizer.step(); các GPU khác chờ", ["step"] + ["chờ"] * (n - 1),
                ["compute"] + ["idle"] * (n - 1)),
        ddp.side("Mỗi process tự chạy optimizer.step() với cùng gradient", ["step"] * n,
                 ["compute"] * n),
        "DP: chỉ GPU 0 giữ tham số thật và trạng thái bộ tối ưu; bước sau lại phải sao chép mô "
        "hình. DDP: mọi process cập nhật cùng một gradient nên các bản sao vẫn giống hệt nhau."))
    return steps


def _chain(links, nbytes: float, what: str) -> list[Transfer]:
    """The links of one NCCL collective, each carrying ``nbytes``."""
    return [Transfer(src, dst, nbytes, what, "nccl") for src, dst in links]


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
        "DP gom (gather) đầu ra của mọi GPU về GPU 0 để tính hàm mất mát ở một chỗ. DDP không "
        "gom gì.")
    loss = Step(
        "Tính hàm mất mát",
        dp.side("Chỉ GPU 0 tính hàm mất mát trên cả batch; các GPU khác chờ",
                ["loss"] + ["chờ"] * (n - 1), ["compute"] + ["idle"] * (n - 1)),
        ddp.side("Mỗi process tính hàm mất mát trên phần dữ liệu của mình", ["loss"] * n,
                 ["compute"] * n),
        "DP: giá trị mất mát của cả batch nằm trên GPU 0. DDP: mỗi process có giá trị mất mát "
        "của riêng nó; phép cộng gradient ở bước sau làm kết quả giống như tính trên cả batch.")
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
        ar = _chain([(j, (j + 1) % n) for j in range(n)], ring, f"AllReduce bucket {k}") if k \
            else []
        ddp_text = (f"Backward tính gradient của bucket {k + 1}" if k == 0 else
                    f"Backward bucket {k + 1}, song song AllReduce bucket {k}")
        steps.append(Step(
            f"Lan truyền ngược ({k + 1}/{b})",
            dp.side(dp_text, ["backward"] * n, ["compute"] * n, out_grads),
            ddp.side(ddp_text, ["backward"] * n, ["compute"] * n, ar),
            ("DP: gradient của đầu ra đi ngược đường gather, từ GPU 0 về từng GPU. " if k == 0
             else "DP chưa gửi gradient nào. ")
            + ("DDP: bucket nào đủ gradient thì được cộng bằng AllReduce ngay, trong khi "
               "backward tính tiếp các tầng phía trước (overlap)." if b > 1 else
               "DDP: chỉ một bucket, AllReduce phải chờ backward xong.")))
    steps.append(Step(
        "Cộng gradient",
        dp.side(f"Reduce gradient ({vi.nbytes(m)}) theo chuỗi NCCL về GPU 0",
                ["nhận, cộng"] + ["gửi"] + ["nhận, cộng, gửi"] * (n - 2), ["comm"] * n,
                _chain(rooted_links("reduce", n), m, "gradient")),
        ddp.side(f"AllReduce bucket {b}: phần duy nhất không được backward che", ["AllReduce"] * n,
                 ["comm"] * n,
                 _chain([(j, (j + 1) % n) for j in range(n)], ring, f"AllReduce bucket {b}")),
        "DP: chỉ sau khi backward xong, ReduceAddCoalesced cộng gradient của mọi bản sao về "
        "GPU 0 bằng Reduce của NCCL (nccl.reduce), theo chuỗi GPU kề nhau: GPU 0 nhận một bản, "
        "không phải N-1 bản. DDP: Ring AllReduce, mỗi GPU gửi 2(N-1)/N bucket."))
    return steps
