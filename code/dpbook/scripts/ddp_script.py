"""A complete DDP training script (section 4.2.2), runnable three ways from the same code.

* ``run(rank, world_size, cfg)`` is a rank function for ``launch.spawn`` (process group already
  initialised); it returns the run's history.
* ``python -m dpbook.scripts.ddp_script ...`` without ``torchrun``: one process, no process
  group, no DDP wrapper; the same loop, sampler and checkpoint code.
* ``torchrun --standalone --nproc_per_node=N -m dpbook.scripts.ddp_script ...``: ``main`` builds
  the process group from the variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``) and always destroys it.

The data order is chosen so that a run on ``N`` ranks with ``batch_size=b`` sees, at every
optimizer step, exactly the samples that one process with ``batch_size=N*b`` sees: both draw one
``DistributedSampler`` permutation (same seed, same epoch) and rank ``r`` takes positions
``r, r+N, ...``; global batch ``k`` is then positions ``k*N*b .. (k+1)*N*b - 1`` of that
permutation on both sides. In float64 the two runs agree to rounding.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .. import vi
from ..averaging import loss_fn
from ..checks import int_at_least, non_negative, one_of
from ..data import synthetic_regression
from ..launch import device as rank_device
from ..models import build_mlp
from ..torchrun.worker import process_group
from ..train import apply_ddp, cpu_copy, mixed_precision
from ._cli import vietnamese_parser

DTYPES = {"float32": torch.float32, "float64": torch.float64}
MODEL = {"in_dim": 16, "hidden": 32, "depth": 3, "out_dim": 4}  # models.build_mlp's defaults


@dataclass(frozen=True)
class ScriptConfig:
    """Everything the script needs, validated once. ``batch_size`` is per rank and per
    micro-batch: one optimizer step sees ``world_size * batch_size * accumulation_steps``
    samples."""

    epochs: int = 3
    batch_size: int = 8
    accumulation_steps: int = 1
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    num_samples: int = 256
    eval_samples: int = 64
    eval_every: int = 1  # epochs between evaluations; the last epoch is always evaluated
    dtype: str = "float32"
    amp: bool = True  # 16-bit autocast on CUDA only: bf16, or fp16 where the GPU lacks bf16
    checkpoint: str | None = None
    resume: bool = False
    progress: bool = True
    device: str | None = None  # without a process group: "cpu" pins it; None: cuda if available

    def __post_init__(self):
        for name in ("epochs", "batch_size", "accumulation_steps", "num_samples",
                     "eval_samples", "eval_every"):
            int_at_least(name, getattr(self, name))
        int_at_least("seed", self.seed, 0)
        non_negative("lr", self.lr)
        if self.lr == 0:
            raise ValueError("lr phải dương (lr = 0 thì mô hình không học gì), nhận được 0.")
        non_negative("momentum", self.momentum)
        if self.momentum >= 1:
            raise ValueError(f"momentum phải nằm trong [0, 1), nhận được {self.momentum!r}.")
        one_of("dtype", self.dtype, tuple(DTYPES))
        if self.resume and not self.checkpoint:
            raise ValueError("resume=True cần checkpoint (đường dẫn file để nạp lại).")


def dataset(cfg: ScriptConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, ``num_samples`` for training then ``eval_samples`` held out, drawn
    from one synthetic task (same teacher) and identical on every rank."""
    ds = synthetic_regression(cfg.num_samples + cfg.eval_samples, MODEL["in_dim"],
                              MODEL["out_dim"], seed=cfg.seed)
    return tuple(t.to(DTYPES[cfg.dtype]) for t in ds.tensors)


def make_loader(cfg: ScriptConfig, rank: int, world_size: int):
    """Training loader of rank ``rank``: a ``DistributedSampler`` shard of the synthetic set."""
    per_step = world_size * cfg.batch_size * cfg.accumulation_steps
    if cfg.num_samples % per_step:
        raise ValueError(
            f"num_samples={cfg.num_samples} phải chia hết cho world_size × batch_size × "
            f"accumulation_steps = {per_step}, để mọi rank có cùng số bước và không mẫu nào "
            "bị lặp lại.")
    ds = TensorDataset(*(t[:cfg.num_samples] for t in dataset(cfg)))
    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=cfg.seed)
    return DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler), sampler


def autocast_dtype(dev: torch.device, cfg: ScriptConfig) -> torch.dtype | None:
    """What autocast computes in: the book's one rule, ``train.mixed_precision`` (on a GPU bf16,
    or fp16 on a GPU without native bf16 such as the T4; ``None``, no autocast, on the CPU or
    with ``amp=False``)."""
    return mixed_precision(dev, cfg.amp).dtype


def autocast(dev: torch.device, cfg: ScriptConfig):
    """16-bit autocast on a GPU, nothing on the CPU: the same loop runs in both places."""
    return mixed_precision(dev, cfg.amp).autocast()


def optimizer_step(model, optimizer, scaler, micro_batches, cfg: ScriptConfig,
                   dev) -> torch.Tensor:
    """Accumulate the gradient of ``accumulation_steps`` micro-batches, synchronising only on
    the last (``no_sync``: forward and backward inside), then step through ``scaler``
    (``train.grad_scaler``: loss scaling under fp16, a pass-through otherwise). Returns this
    rank's mean loss over its micro-batches (a detached tensor)."""
    k_steps, total = len(micro_batches), torch.zeros((), device=dev, dtype=torch.float64)
    for k, (x, y) in enumerate(micro_batches):
        skip_sync = isinstance(model, DDP) and k < k_steps - 1
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            x, y = x.to(dev), y.to(dev)
            with autocast(dev, cfg):
                pred = model(x)
            loss = loss_fn(pred.to(y.dtype), y) / k_steps  # mean over the K micro-batches
            scaler.scale(loss).backward()
        total += loss.detach().double()
    scaler.step(optimizer)  # skipped if fp16 gradients overflowed; the scale then shrinks
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


def mean_over_ranks(t: torch.Tensor) -> float:
    """The mean of a scalar over every rank (one tiny AllReduce; every rank must call it)."""
    if dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t)  # SUM, then divide (ReduceOp.AVG works on gloo too: a choice)
        t /= dist.get_world_size()
    return t.item()


@torch.no_grad()
def evaluate(model, cfg: ScriptConfig, rank: int, world_size: int, dev) -> dict:
    """MSE and MAE on a held-out set: rank ``r`` scores samples ``r, r+N, ...`` (no padding,
    no duplicate), then the sums and counts are all-reduced, so every rank gets the metrics of
    the whole set. Runs the inner module: no DDP hook, no collective inside the forward."""
    net = model.module if isinstance(model, DDP) else model
    net.eval()
    x, y = (t[cfg.num_samples:][rank::world_size].to(dev) for t in dataset(cfg))
    with autocast(dev, cfg):
        pred = net(x)
    err = (pred.to(y.dtype) - y).double()
    # Sums and counts, not means: shards may differ in size (63 samples on 2 ranks).
    sums = torch.stack([err.pow(2).sum(), err.abs().sum(), err.new_tensor(err.numel()),
                        err.new_tensor(len(x))])
    if dist.is_initialized():
        dist.all_reduce(sums)
    net.train()
    return {"mse": (sums[0] / sums[2]).item(), "mae": (sums[1] / sums[2]).item(),
            "samples": int(sums[3].item()), "local_samples": len(x)}


def progress_line(label: str, done: int, total: int, loss: float, width: int = 20) -> str:
    """One frame of the text progress bar (``tqdm`` is not a dependency of the book)."""
    filled = round(width * done / total)
    bar = "█" * filled + "·" * (width - filled)
    return f"{label} |{bar}| {done}/{total} loss={vi.number(loss, 4)}"


class Progress:
    """Rank 0's progress bar: redrawn in place on a terminal, a few full lines elsewhere (a
    notebook, a log file), so the output stays short."""

    def __init__(self, label: str, total: int, enabled: bool, lines: int = 4):
        self.label, self.total, self.enabled, self.done = label, total, enabled, 0
        self.every = max(1, total // lines)
        self.tty = sys.stdout.isatty()

    def update(self, loss: float) -> None:
        self.done += 1
        if not self.enabled:
            return
        line = progress_line(self.label, self.done, self.total, loss)
        if self.tty:
            print("\r" + line, end="\n" if self.done == self.total else "", flush=True)
        elif self.done % self.every == 0 or self.done == self.total:
            print(line, flush=True)


def save_checkpoint(model, optimizer, epoch: int, cfg: ScriptConfig, scaler=None) -> None:
    """Rank 0 writes the unwrapped model (keys without ``module.``), the optimizer state, the
    fp16 loss scaler's state (its current scale) and the epoch, as CPU tensors, to a temporary
    name then renames it (a crash mid-write leaves the old file); every rank then waits at a
    barrier, so nobody reads a half-written file."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        net = model.module if isinstance(model, DDP) else model
        path = Path(cfg.checkpoint)
        path.parent.mkdir(parents=True, exist_ok=True)  # e.g. _build/runs/ on a fresh clone
        tmp = path.with_name(path.name + ".tmp")
        scaler_state = scaler.state_dict() if scaler is not None and scaler.is_enabled() else {}
        torch.save(cpu_copy({"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                           "scaler": scaler_state, "epoch": epoch, "config": asdict(cfg)}), tmp)
        os.replace(tmp, path)
    if dist.is_initialized():
        dist.barrier()


def load_checkpoint(path: str, model, optimizer=None, dev=None, scaler=None) -> int:
    """Load a checkpoint written by ``save_checkpoint`` into a plain (unwrapped) model and,
    if given, the optimizer and the loss scaler; ``map_location`` puts every tensor on this
    rank's device. Returns the epoch it was saved after."""
    ckpt = torch.load(path, map_location=dev or "cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    if optimizer is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    if scaler is not None and ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    return ckpt["epoch"]


def _from_rank_0(value):
    """``value`` as rank 0 has it (``dist.broadcast_object_list``), on every rank; ``value``
    itself outside a process group."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _setup(cfg: ScriptConfig):
    """Device, model (wrapped in DDP inside a process group), optimizer, gradient scaler, first
    epoch."""
    dev = (rank_device() if dist.is_initialized() else torch.device(
        cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")))
    model = build_mlp(seed=cfg.seed, **MODEL).to(dev, DTYPES[cfg.dtype])
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    scaler = mixed_precision(dev, cfg.amp).scaler()
    start = 0
    if cfg.resume:  # a missing file is an error, never a silent fresh start
        # Rank 0 decides and every rank follows (_from_rank_0): ranks that each looked for
        # themselves could disagree (no shared file system, NFS caching) and then wait in
        # different collectives.
        if not _from_rank_0(Path(cfg.checkpoint).is_file()):
            raise FileNotFoundError(f"resume=True: không có file checkpoint {cfg.checkpoint!r} "
                                    "để nạp; bỏ resume để huấn luyện từ đầu.")
        start = _from_rank_0(load_checkpoint(cfg.checkpoint, model, optimizer, dev, scaler) + 1)
    # DDP wraps the same parameter tensors, so the optimizer built above still updates them.
    wrapped = apply_ddp(model) if dist.is_initialized() else model
    return dev, wrapped, optimizer, scaler, start


def run(rank: int, world_size: int, cfg: ScriptConfig) -> dict:
    """Train as ``cfg`` says; a ``launch.spawn`` rank function, also called by ``main``.
    Returns the global mean loss of every optimizer step, the evaluations (metrics of the
    whole held-out set), and the final weights of the unwrapped model on the CPU."""
    if dist.is_initialized() and (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
        raise ValueError(f"rank={rank}, world_size={world_size} không khớp process group "
                         f"({dist.get_rank()}, {dist.get_world_size()}).")
    dev, model, optimizer, scaler, start = _setup(cfg)
    loader, sampler = make_loader(cfg, rank, world_size)
    steps = len(loader) // cfg.accumulation_steps
    losses, evals = [], []
    for epoch in range(start, cfg.epochs):
        sampler.set_epoch(epoch)  # a new permutation each epoch, the same on every rank
        bar = Progress(f"epoch {epoch + 1}/{cfg.epochs}", steps, cfg.progress and rank == 0)
        batches = iter(loader)
        for _ in range(steps):
            micro = [next(batches) for _ in range(cfg.accumulation_steps)]
            loss = optimizer_step(model, optimizer, scaler, micro, cfg, dev)
            losses.append(mean_over_ranks(loss))
            bar.update(losses[-1])
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            evals.append({"epoch": epoch + 1, "step": len(losses),
                          **evaluate(model, cfg, rank, world_size, dev)})
            if rank == 0 and cfg.progress:
                ev = evals[-1]
                print(f"  đánh giá sau epoch {epoch + 1}: MSE = {vi.number(ev['mse'], 4)}, "
                      f"MAE = {vi.number(ev['mae'], 4)} ({ev['samples']} mẫu)", flush=True)
        if cfg.checkpoint:
            save_checkpoint(model, optimizer, epoch, cfg, scaler)
    net = model.module if isinstance(model, DDP) else model
    amp = mixed_precision(dev, cfg.amp)
    return {"rank": rank, "world_size": world_size, "device": str(dev),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "autocast": amp.dtype is not None, "amp_dtype": amp.name,
            "loss_scaling": scaler.is_enabled(), "start_epoch": start,
            "steps_per_epoch": steps, "losses": losses, "evals": evals,
            "state": cpu_copy(net.state_dict())}


def parse_args(argv: Sequence[str] | None = None) -> ScriptConfig:
    """The command line of ``python -m dpbook.scripts.ddp_script`` (help in Vietnamese)."""
    d = ScriptConfig()
    p = vietnamese_parser(prog="python -m dpbook.scripts.ddp_script",
                          description="Huấn luyện MLP nhỏ bằng DDP (mục 4.2.2).")
    p.add_argument("--epochs", type=int, default=d.epochs, help="số epoch")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="số mẫu mỗi micro-batch trên MỖI rank")
    p.add_argument("--accumulation-steps", type=int, default=d.accumulation_steps,
                   help="số micro-batch cộng dồn gradient trước một bước cập nhật")
    p.add_argument("--lr", type=float, default=d.lr, help="tốc độ học của SGD")
    p.add_argument("--momentum", type=float, default=d.momentum, help="momentum của SGD")
    p.add_argument("--seed", type=int, default=d.seed, help="hạt giống: trọng số và dữ liệu")
    p.add_argument("--num-samples", type=int, default=d.num_samples, help="số mẫu huấn luyện")
    p.add_argument("--eval-samples", type=int, default=d.eval_samples, help="số mẫu đánh giá")
    p.add_argument("--eval-every", type=int, default=d.eval_every,
                   help="đánh giá sau mỗi bao nhiêu epoch")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=d.dtype, help="kiểu của tham số")
    p.add_argument("--no-amp", dest="amp", action="store_false",
                   help="tắt autocast 16 bit trên GPU (bf16, hoặc fp16 nếu GPU không có bf16)")
    p.add_argument("--checkpoint", default=None,
                   help="file checkpoint, rank 0 ghi sau mỗi epoch (ví dụ _build/runs/ddp.pt; "
                        "thư mục cha được tạo nếu chưa có); bỏ đi thì không ghi gì")
    p.add_argument("--resume", action="store_true",
                   help="nạp file --checkpoint (phải có sẵn) rồi huấn luyện tiếp")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="không in thanh tiến độ")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint:
        p.error("--resume cần --checkpoint FILE: file checkpoint để nạp.")
    if args.checkpoint and os.path.isdir(args.checkpoint):
        p.error(f"--checkpoint {args.checkpoint!r} là một thư mục; hãy cho đường dẫn file, "
                "ví dụ _build/runs/ddp.pt.")
    if args.resume and not os.path.isfile(args.checkpoint):
        # One line and status 2, before any process group: nothing silently starts from scratch.
        p.exit(2, f"ddp_script: lỗi: --resume: không có file checkpoint {args.checkpoint!r} để "
                  "nạp. Bỏ --resume để huấn luyện từ đầu (checkpoint sẽ được ghi vào đúng đường "
                  "dẫn ấy).\n")
    try:
        return ScriptConfig(**vars(args))
    except ValueError as err:
        p.error(str(err))  # exits with status 2: the usage line, then the message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set): one process group
    from the environment, NCCL if this node has a GPU per local process, else gloo; always
    destroyed. Without them: a single process, no process group."""
    cfg = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        history = run(0, 1, cfg)
    else:
        with process_group():  # NCCL and a GPU each if the node has one per process, else gloo
            history = run(dist.get_rank(), dist.get_world_size(), cfg)
    if history["rank"] == 0:
        print(f"Xong: {history['world_size']} process, thiết bị {history['device']}, "
              f"autocast {history['amp_dtype'] or 'tắt'}, "
              f"{len(history['losses'])} bước, giá trị mất mát cuối = "
              f"{vi.number(history['losses'][-1], 4)}"
              + (f"; checkpoint: {cfg.checkpoint}" if cfg.checkpoint else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
