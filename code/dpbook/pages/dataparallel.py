"""Section 4.1.2 (DataParallel): ``torch.nn.DataParallel`` (DP), taken apart on the CPU and
measured against DDP on GPUs. (The GIL measurement of the same page is ``dpbook.gil``.)

* ``dataparallel_info``: wrap a model the way a reader would and report what DP did with it.
  Without CUDA devices DP keeps ``device_ids`` empty and its ``forward`` just calls the module.
* ``emulate_dp_step``: one DP training step on the CPU with DP's four stages, in the order of
  ``DataParallel.forward`` (scatter, replicate, forward in threads, gather) and the same autograd
  shape: each replica's parameters are differentiable copies of the master's, as ``Broadcast``
  makes them, so backward sums the replicas' gradients into the master's parameters, as
  ``ReduceAddCoalesced`` does on GPU 0.
* ``backward_of``, ``dp_memory_floor``, ``dp_largest_model``: what PyTorch's source says DP's
  backward does, the training state DP leaves on GPU 0 (and its peak at the gradients' reduce)
  against the other GPUs, and the largest model GPU 0 can train.
* ``COMM_LINES``, ``comm_source_lines``: the lines of ``torch.nn.parallel`` that say how DP
  moves data (scatter and gather are copies; replicate is a coalesced Broadcast and the backward
  reduction ``comm.reduce_add``, NCCL's Broadcast and Reduce when NCCL is available), read from
  the installed PyTorch. ``traffic_report``: the page's traffic table, through ``dpbook.vi``.
* ``WEAKNESSES``: DataParallel's weaknesses, the one list the chapter's pages refer to.
* ``measure_dataparallel`` (in this process) and ``ddp_step_worker`` (one rank, for
  ``launch.spawn``): the same model, the same global batch and Adam, timed step by step, with
  each device's peak memory; ``compare_dp_ddp`` runs both on the GPUs of this machine."""

from __future__ import annotations

import copy
import statistics
import threading
from dataclasses import dataclass

import torch
from torch import nn

from .. import vi
from ..checks import int_at_least
from ..data import rank_batch
from ..launch import spawn
from ..measure import peak_memory, time_steps
from ..costs import rooted_bytes
from ..memory import Card, bytes_per_param, card, fits
from ..models import build_mlp, num_params
from ..train import apply_ddp, train_step
from ..widgets.dp_vs_ddp import traffic_totals

# A model large enough that DP's per-step copies show on a GPU, small enough for a 16 GB one:
# 8 blocks of 2048 units, 33,571,840 parameters (134 MB in fp32; Adam's two moments add 269 MB).
GPU_MODEL = {"in_dim": 1024, "hidden": 2048, "depth": 8, "out_dim": 1024}


# DataParallel's weaknesses, in the words and the order of section 4.1.2; the chapter's and the
# part's openers name the same six (tests/test_prose_numbers.py checks the three pages).
WEAKNESSES = (
    "một process, các luồng chung một GIL",
    "sao chép lại mô hình ở mọi bước",
    "cộng gradient sau lượt truyền ngược, không chồng lấp",
    "GPU 0 gánh thêm bộ nhớ và việc",
    "đầu vào và đầu ra dồn qua GPU 0",
    "chỉ chạy trong một máy",
)

# (module, function, a line of its source): how DP moves data, in torch.nn.parallel.
COMM_LINES = (
    ("torch.nn.parallel.scatter_gather", "scatter", "Scatter.apply(target_gpus, None, dim, obj)"),
    ("torch.nn.parallel._functions", "Scatter.forward",
     "comm.scatter(input, target_gpus, chunk_sizes, ctx.dim, streams)"),
    ("torch.nn.parallel.comm", "scatter", "torch._C._scatter(tensor, devices, chunk_sizes, dim, streams)"),
    ("torch.nn.parallel.replicate", "replicate",
     "param_copies = _broadcast_coalesced_reshape(params, devices, detach)"),
    ("torch.nn.parallel.replicate", "_broadcast_coalesced_reshape",
     "tensor_copies = Broadcast.apply(devices, *tensors)"),
    ("torch.nn.parallel._functions", "Broadcast.forward",
     "outputs = comm.broadcast_coalesced(inputs, ctx.target_gpus)"),
    ("torch.nn.parallel.comm", "broadcast_coalesced",
     "return torch._C._broadcast_coalesced(tensors, devices, buffer_size)"),
    ("torch.nn.parallel._functions", "Broadcast.backward", "grads = ReduceAddCoalesced.apply("),
    ("torch.nn.parallel._functions", "ReduceAddCoalesced.forward",
     "results = comm.reduce_add_coalesced(grads_, destination)"),
    ("torch.nn.parallel.comm", "reduce_add_coalesced",
     "flat_result = reduce_add(flat_tensors, destination)"),
    ("torch.nn.parallel.comm", "reduce_add", "if nccl.is_available(inputs):"),
    ("torch.nn.parallel.comm", "reduce_add", "nccl.reduce(inputs, output=result, root=root_index)"),
    ("torch.nn.parallel.comm", "reduce_add",
     "result.add_(other.to(device=destination_device, non_blocking=True))"),
    ("torch.nn.parallel.scatter_gather", "gather", "return Gather.apply(target_device, dim, *outputs)"),
    ("torch.nn.parallel._functions", "Gather.forward",
     "output = comm.gather(inputs, ctx.dim, ctx.target_device)"),
    ("torch.nn.parallel.comm", "gather", "return torch._C._gather(tensors, dim, destination)"),
)


def comm_source_lines(lines=COMM_LINES) -> list[tuple[str, str, str, bool]]:
    """``(file, function, line, found)`` for each of ``lines``, with ``found`` read from the
    installed PyTorch's source by ``inspect.getsource`` (``file`` relative to ``torch/``)."""
    import importlib
    import inspect

    rows = []
    for module, qualname, line in lines:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        source = " ".join(inspect.getsource(obj).split())
        file = module.removeprefix("torch.").replace(".", "/") + ".py"
        rows.append((f"torch/{file}", qualname, line, " ".join(line.split()) in source))
    return rows


def traffic_report(world_sizes=(2, 4, 8), **sizes) -> str:
    """One line per N: bytes in + out of DP's GPU 0, DP's busiest GPU and one DDP GPU in one
    step (``widgets.dp_vs_ddp.traffic_totals``, NCCL), and DP's GPU 0 without NCCL (star)."""
    lines = []
    for n in world_sizes:
        chain, star = traffic_totals(n, **sizes), traffic_totals(n, route="star", **sizes)
        lines.append(f"N = {n}: DP, GPU 0 {vi.nbytes(chain['dp'][0])}; DP, GPU bận nhất "
                     f"{vi.nbytes(max(chain['dp']))}; DDP, mỗi GPU {vi.nbytes(chain['ddp'][0])}; "
                     f"DP không có NCCL, GPU 0 {vi.nbytes(star['dp'][0])}")
    return "\n".join(lines)


def rooted_report(collective: str, nbytes: float, world_size: int) -> str:
    """What each GPU sends and receives in DP's Broadcast (replicate) or Reduce (the gradients'
    sum) of ``nbytes``: NCCL's chain next to the star of the fallback without NCCL."""
    chain = rooted_bytes(collective, nbytes, world_size)
    star = rooted_bytes(collective, nbytes, world_size, "star")
    cell = lambda t, k: f"gửi {vi.nbytes(t.sent[k])}, nhận {vi.nbytes(t.received[k])}"  # noqa: E731
    name = {"broadcast": "Broadcast", "reduce": "Reduce"}[collective]
    lines = [f"{name} {vi.nbytes(nbytes)}, N = {world_size}",
             f"{'':8}{'chuỗi NCCL':<26}hình sao (không có NCCL)"]
    lines += [f"{f'GPU {k}':<8}{cell(chain, k):<26}{cell(star, k)}" for k in range(world_size)]
    return "\n".join(lines)


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def why_no_dataparallel(gpus: int | None = None) -> str:
    """Why this machine cannot run DP on several GPUs (Vietnamese), or '' if it can."""
    gpus = cuda_devices() if gpus is None else gpus
    if gpus >= 2:
        return ""
    have = "không có GPU CUDA nào" if gpus == 0 else "chỉ có 1 GPU CUDA"
    return (f"Không đo được DP với DDP trên máy này: máy {have}. nn.DataParallel cần ít nhất "
            "2 GPU CUDA để có gì mà sao chép và chia batch; không có GPU, nó để device_ids "
            "rỗng và forward chỉ gọi thẳng mô hình bên trong (với 1 GPU thì cũng chỉ chạy "
            "mô hình trên GPU đó). Bên dưới là phân tích bằng công thức thay cho phép đo.")


@dataclass(frozen=True)
class DataParallelInfo:
    """What ``nn.DataParallel`` did with a model on this machine."""

    device_ids: tuple[int, ...]
    param_device: str
    output_device: str
    same_module: bool  # dp.module is the model that was wrapped
    max_abs_diff: float  # |DP(x) - model(x)|, largest element

    def describe(self) -> str:
        if not self.device_ids:
            mode = "không có GPU: DataParallel không sao chép gì, forward gọi thẳng mô hình"
        elif len(self.device_ids) == 1:
            mode = "một GPU: DataParallel chỉ chạy mô hình trên GPU đó, không sao chép"
        else:
            mode = f"sao chép mô hình sang GPU {list(self.device_ids)} ở mỗi lượt truyền xuôi"
        return (f"device_ids = {list(self.device_ids)} ({mode}).\n"
                f"dp.module là chính mô hình đã bọc: {self.same_module}; tham số nằm trên "
                f"{self.param_device}, đầu ra trên {self.output_device}.\n"
                f"Sai khác lớn nhất giữa dp(x) và model(x): {vi.general(self.max_abs_diff, 3)}")


def dataparallel_info(model: nn.Module, x: torch.Tensor) -> DataParallelInfo:
    """Wrap ``model`` in ``nn.DataParallel`` (all visible GPUs, or none) and run ``x``."""
    if cuda_devices():
        model = model.to("cuda:0")  # DP wants the master copy on device_ids[0]
        x = x.to("cuda:0")
    dp = nn.DataParallel(model)
    with torch.no_grad():
        out, ref = dp(x), model(x)
    return DataParallelInfo(tuple(dp.device_ids), str(next(model.parameters()).device),
                            str(out.device), dp.module is model,
                            (out - ref).abs().max().item())


def backward_of(names=("Scatter", "Broadcast", "Gather")) -> dict[str, str]:
    """The autograd function that each of DP's functions (``torch.nn.parallel._functions``)
    applies in its ``backward``, read from the installed PyTorch's source."""
    import inspect
    import re

    from torch.nn.parallel import _functions

    found = {}
    for name in names:
        source = inspect.getsource(getattr(_functions, name).backward)
        found[name] = re.search(r"(\w+)\.apply\(", source).group(1)
    return found


def dp_memory_floor(num_params: int, precision: str = "fp32", optimizer: str = "adam") -> dict:
    """Training state bytes DP puts on each GPU, activations and outputs aside.

    ``gpu0``: the master parameters, their gradients and the whole optimizer state.
    ``gpu0_reduce``: GPU 0 at the end of backward, while ``ReduceAddCoalesced`` sums the
    replicas' gradients: replica 0's own gradients are separate tensors (``broadcast_coalesced``
    returns device 0's inputs as they are, torch/csrc/cuda/comm.cpp, so replica 0's gradients
    are not the master's ``.grad``) and live until the summed gradients exist: one more set of
    gradients. This is reasoned from the source; measuring it needs two GPUs.
    ``other``: every other GPU, its replica's parameters and the gradients it computed, until
    they are reduced onto GPU 0."""
    int_at_least("num_params", num_params)
    p, g, o = bytes_per_param(precision, optimizer)
    return {"gpu0": num_params * (p + g + o), "gpu0_reduce": num_params * (p + 2 * g + o),
            "other": num_params * (p + g)}


def dp_largest_model(gpu: Card | str = "H100 80GB", precision: str = "fp32",
                     optimizer: str = "adam") -> int:
    """The largest parameter count whose peak on GPU 0 (``dp_memory_floor``'s ``gpu0_reduce``)
    fits in what PyTorch can allocate on ``gpu`` (a ``memory.Card`` or the name of one of
    ``memory.CARDS``)."""
    gpu = card(gpu) if isinstance(gpu, str) else gpu
    p, g, o = bytes_per_param(precision, optimizer)
    n = int(gpu.usable_bytes // (p + 2 * g + o))
    while n and not fits(dp_memory_floor(n, precision, optimizer)["gpu0_reduce"], gpu):
        n -= 1
    return n


# ------------------------------------------------------------------ DP's step, on the CPU

@dataclass(frozen=True)
class EmulatedStep:
    """One emulated DP step: who did what, and how the gradients came back."""

    chunk_sizes: tuple[int, ...]  # rows of the batch each replica got (scatter, dim 0)
    threads: tuple[str, ...]  # the thread that ran each replica's forward
    output_rows: int  # rows of the gathered output on the master
    loss: float
    reduce_diff: float  # max |master grad - sum of replica grads|
    full_batch_diff: float  # max |master grad - grad of the plain model on the whole batch|


def _replicate(model: nn.Module) -> tuple[nn.Module, list[torch.Tensor]]:
    """A copy of ``model`` whose parameters are differentiable copies (``clone``) of the
    master's, as DP's ``replicate`` builds them with ``Broadcast``; returns the copies too."""
    replica = copy.deepcopy(model)
    copies = []
    for mod, rep in zip(model.modules(), replica.modules()):
        for name, p in mod._parameters.items():
            if p is not None:
                c = p.clone()
                c.retain_grad()  # keep the replica's gradient, to show the reduction
                rep._parameters[name] = c  # a non-leaf tensor, as in DP's replicas
                copies.append(c)
    return replica, copies


def emulate_dp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    num_replicas: int = 2) -> EmulatedStep:
    """Forward and backward of one DP step on the CPU; ``model`` plays GPU 0's master copy and
    ``num_replicas`` the number of GPUs. Leaves the summed gradients in ``model``'s ``.grad``."""
    int_at_least("num_replicas", num_replicas)
    model.zero_grad(set_to_none=True)
    chunks = x.chunk(num_replicas, dim=0)  # 1. scatter (fewer chunks if the batch is small)
    replicas = [_replicate(model) for _ in chunks]  # 2. replicate, one copy per chunk
    outputs, names = [None] * len(chunks), [""] * len(chunks)
    grad_enabled = torch.is_grad_enabled()

    def run(i: int) -> None:  # 3. parallel_apply: one thread per replica
        torch.set_grad_enabled(grad_enabled)  # grad mode is per thread, as DP restores it
        outputs[i] = replicas[i][0](chunks[i])
        names[i] = threading.current_thread().name

    threads = [threading.Thread(target=run, args=(i,), name=f"luồng {i}")
               for i in range(len(chunks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = torch.cat(outputs, dim=0)  # 4. gather onto the master
    loss = nn.functional.mse_loss(out, y)  # the loss of the whole batch, on the master
    loss.backward()  # gradients flow back through gather, the threads' graphs and the copies
    master = [p.grad for p in model.parameters()]
    summed = [sum(cs) for cs in zip(*[[c.grad for c in copies] for _, copies in replicas])]
    reference = torch.autograd.grad(nn.functional.mse_loss(model(x), y),
                                    list(model.parameters()))
    diff = lambda a, b: max((u - v).abs().max().item() for u, v in zip(a, b))
    return EmulatedStep(tuple(c.shape[0] for c in chunks), tuple(names), out.shape[0],
                        loss.item(), diff(master, summed), diff(master, reference))


# ------------------------------------------------------------------ DP against DDP, on GPUs

def _batch(model_kwargs: dict, global_batch: int):
    from ..data import synthetic_regression

    ds = synthetic_regression(global_batch, model_kwargs["in_dim"], model_kwargs["out_dim"])
    return ds.tensors


def measure_dataparallel(model_kwargs: dict | None = None, global_batch: int = 256,
                         steps: int = 5, warmup: int = 2,
                         device_ids: list[int] | None = None) -> dict:
    """Train ``build_mlp(**model_kwargs)`` with Adam under ``nn.DataParallel`` on CUDA devices
    ``device_ids`` (all by default); return the median step time and each device's peak."""
    if not cuda_devices():
        raise RuntimeError(why_no_dataparallel(0))
    kw = {**GPU_MODEL, **(model_kwargs or {})}
    device_ids = list(range(cuda_devices())) if device_ids is None else list(device_ids)
    result = _run_dataparallel(kw, global_batch, steps, warmup, device_ids)
    torch.cuda.empty_cache()  # the model, optimizer and batch died with _run_dataparallel
    return result


def _run_dataparallel(kw: dict, global_batch: int, steps: int, warmup: int,
                      device_ids: list[int]) -> dict:
    main = torch.device("cuda", device_ids[0])
    model = build_mlp(**kw).to(main)
    wrapped = nn.DataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = (t.to(main) for t in _batch(kw, global_batch))

    def step():
        train_step(wrapped, optimizer, x, y)
        for d in device_ids:
            torch.cuda.synchronize(d)

    times = time_steps(step, repeats=steps, warmup=warmup, dev=main)
    for d in device_ids:
        torch.cuda.reset_peak_memory_stats(d)
    step()
    return {"method": "DP", "world_size": len(device_ids), "num_params": num_params(model),
            "step_s": statistics.median(times), "step_times": times,
            "peak_bytes": [torch.cuda.max_memory_allocated(d) for d in device_ids]}


def ddp_step_worker(rank: int, world_size: int, model_kwargs: dict | None = None,
                    global_batch: int = 256, steps: int = 5, warmup: int = 2) -> dict:
    """Rank function for ``launch.spawn``: the same model, global batch and Adam as
    ``measure_dataparallel``, under DDP; this rank trains on its ``1/world_size`` of the batch."""
    kw = {**GPU_MODEL, **(model_kwargs or {})}
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} phải chia hết cho world_size={world_size}.")
    model = build_mlp(**kw)
    ddp = apply_ddp(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    dev = next(ddp.parameters()).device
    x, y = rank_batch(_batch(kw, global_batch), rank, global_batch // world_size, dev)
    times = time_steps(lambda: train_step(ddp, optimizer, x, y), repeats=steps, warmup=warmup,
                       dev=dev)
    peak = peak_memory(lambda: train_step(ddp, optimizer, x, y), ddp, optimizer)
    return {"method": "DDP", "rank": rank, "device": str(dev), "num_params": num_params(model),
            "step_s": statistics.median(times), "step_times": times, "peak_bytes": peak.peak}


def compare_dp_ddp(world_size: int | None = None, global_batch: int = 256, **kwargs) -> dict:
    """DP (this process, ``world_size`` GPUs) against DDP (``world_size`` processes, NCCL), on
    the same global batch, rounded down to a multiple of ``world_size`` so DDP can split it."""
    gpus = cuda_devices()
    world_size = gpus if world_size is None else world_size
    if world_size < 2 or gpus < world_size:
        raise RuntimeError(why_no_dataparallel(gpus) or
                           f"world_size={world_size} cần {world_size} GPU, máy có {gpus}.")
    global_batch -= global_batch % world_size
    int_at_least("global_batch", global_batch)
    kwargs["global_batch"] = global_batch
    dp = measure_dataparallel(device_ids=list(range(world_size)), **kwargs)
    ranks = spawn(ddp_step_worker, world_size=world_size, output="none", **kwargs)
    return {"dp": dp, "ddp": ranks, "global_batch": global_batch,
            "ddp_step_s": max(r["step_s"] for r in ranks),  # a step ends when the slowest does
            "ddp_peak_bytes": [r["peak_bytes"] for r in ranks]}
