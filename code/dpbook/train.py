"""Apply a data-parallel wrapper to a model, by verb: ``apply_ddp``, ``apply_fsdp``, ``apply_fsdp2``.

Models stay ignorant of parallelism; these functions take a plain model on any device, move it
to the rank's device (``launch.device()``) and wrap it. They must run inside an initialised
process group (for instance in a function started by ``launch.spawn``). FSDP2 is applied in one
place, ``shard_blocks``, always on ``rank_mesh()``, the mesh of the rank's own device.

Mixed precision is chosen in one place too: ``mixed_precision(dev)`` is the rule of every
training script (autocast on a GPU only, in ``amp_dtype``: bf16 where the GPU computes it natively,
``native_bf16``, else fp16), and its ``scaler()`` is ``grad_scaler`` (loss scaling for fp16, a
pass-through otherwise).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .averaging import flat_grad, loss_fn
from .checks import one_of
from .launch import device
from .models import Block

METHODS = ("ddp", "fsdp1", "fsdp2")
FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


@dataclass(frozen=True)
class Parallel:
    """How to wrap: ``method`` and its options, validated once."""

    method: str = "ddp"
    strategy: str = "FULL_SHARD"  # fsdp1 only
    reshard_after_forward: bool | None = None  # fsdp2 only; None: PyTorch's default
    shard_size: int | None = None  # ranks per shard group for hybrid sharding (fsdp1 and fsdp2)

    def __post_init__(self):
        one_of("method", self.method, METHODS)
        if self.method == "fsdp1":
            one_of("strategy", self.strategy, FSDP1_STRATEGIES)
        if self.method == "fsdp1" and self.strategy == "HYBRID_SHARD" and self.shard_size is None:
            raise ValueError("HYBRID_SHARD cần shard_size (số rank trong một nhóm shard).")

    @classmethod
    def for_strategy(cls, strategy: str) -> "Parallel":
        """The wrapping that realises a ledger strategy of ``dpbook.memory``: DDP, or one of
        FSDP1's sharding strategies (HYBRID_SHARD needs a ``shard_size``: use the constructor)."""
        one_of("strategy", strategy, ("DDP",) + FSDP1_STRATEGIES)
        return cls("ddp") if strategy == "DDP" else cls("fsdp1", strategy=strategy)

    @property
    def ledger_strategy(self) -> str:
        """The ``memory.vram_ledger`` / ``costs`` strategy this wrapping realises. FSDP2 with
        ``reshard_after_forward=False`` keeps parameters gathered between forward and backward,
        which is SHARD_GRAD_OP; with a ``shard_size`` it is HYBRID_SHARD."""
        if self.method == "ddp":
            return "DDP"
        if self.shard_size is not None:
            return "HYBRID_SHARD"
        if self.method == "fsdp1":
            return self.strategy
        return "SHARD_GRAD_OP" if self.reshard_after_forward is False else "FULL_SHARD"

    @property
    def label(self) -> str:
        if self.method == "fsdp1":
            return f"FSDP1 {self.strategy}"
        if self.method == "fsdp2":
            mesh = f", HSDP {self.shard_size}" if self.shard_size else ""
            return f"FSDP2 reshard_after_forward={self.reshard_after_forward}{mesh}"
        return "DDP"


def rank_mesh(shard_size: int | None = None):
    """The device mesh of this rank's device (``launch.device()``): 1-D over every rank, or, with
    ``shard_size``, 2-D (replicate, shard) that shards inside groups of ``shard_size`` ranks.

    FSDP2 always gets one: without it, ``fully_shard`` builds a mesh for
    ``torch._C._get_accelerator()``, which is CUDA on every CUDA build of torch whatever the
    backend, so a gloo rank would set a GPU as its device and move its parameters there. The 1-D
    mesh wraps the default group itself: ``init_device_mesh("cpu", ...)`` on a CUDA build would
    create a second gloo group for it."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if shard_size is None:
        return DeviceMesh.from_group(dist.group.WORLD, device().type)
    world = dist.get_world_size()
    if world % shard_size:
        raise ValueError(f"shard_size={shard_size} phải chia hết world_size={world}.")
    return init_device_mesh(device().type, (world // shard_size, shard_size),
                            mesh_dim_names=("replicate", "shard"))


def apply_ddp(model: nn.Module, **ddp_kwargs) -> nn.Module:
    """``DistributedDataParallel`` on this rank's device (one device per process)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = device()
    model = model.to(dev)
    return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, **ddp_kwargs)


def apply_fsdp(model: nn.Module, strategy: str = "FULL_SHARD", shard_size: int | None = None,
               **fsdp_kwargs) -> nn.Module:
    """FSDP1 with one unit per ``Block`` (plus the root, which keeps what no block owns)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    Parallel("fsdp1", strategy=strategy, shard_size=shard_size)  # validates
    if strategy == "HYBRID_SHARD":
        fsdp_kwargs["device_mesh"] = rank_mesh(shard_size)
    dev = device()
    fsdp_kwargs.setdefault("auto_wrap_policy", ModuleWrapPolicy({Block}))
    with warnings.catch_warnings():
        # NO_SHARD is deprecated in favour of DDP; the chapter uses it on purpose, to compare.
        warnings.filterwarnings("ignore", message=".*NO_SHARD.*", category=FutureWarning)
        return FSDP(model.to(dev), sharding_strategy=ShardingStrategy[strategy],
                    device_id=dev, **fsdp_kwargs)


def apply_fsdp2(model: nn.Module, reshard_after_forward: bool | None = None,
                shard_size: int | None = None, **fully_shard_kwargs) -> nn.Module:
    """FSDP2: ``fully_shard`` each ``Block``, then the root (in place; returns the model).

    ``reshard_after_forward=None`` is PyTorch's default: reshard every block after forward
    (ZeRO-3), but keep the root unsharded, since backward needs it first. ``True`` reshards the
    root too; ``False`` keeps every unit unsharded until backward (ZeRO-2-like).
    """
    if shard_size is not None:
        fully_shard_kwargs["mesh"] = rank_mesh(shard_size)
    return shard_blocks(model.to(device()), Block, reshard_after_forward=reshard_after_forward,
                        **fully_shard_kwargs)


def shard_blocks(model: nn.Module, block_cls: type, separate=(),
                 **fully_shard_kwargs) -> nn.Module:
    """FSDP2 by hand: ``fully_shard`` every ``block_cls`` module, then the root (which keeps the
    parameters no block owns), all on one mesh (``rank_mesh()`` unless ``mesh`` is given).
    ``separate``: modules, or lists of modules, that become units of their own, resharded after
    forward, so that the root keeps nothing of them (how torchtitan wraps the embedding and
    ``[norm, output]``). Unlike ``apply_fsdp2`` it does not move the model, so it also works on a
    model that still lives on the meta device."""
    from torch.distributed.fsdp import fully_shard

    if "mesh" not in fully_shard_kwargs:
        fully_shard_kwargs["mesh"] = rank_mesh()
    for unit in separate:
        fully_shard(unit, **{**fully_shard_kwargs, "reshard_after_forward": True})
    for module in model.modules():
        if isinstance(module, block_cls):
            fully_shard(module, **fully_shard_kwargs)
    fully_shard(model, **fully_shard_kwargs)
    return model


def apply_parallel(model: nn.Module, par: Parallel) -> nn.Module:
    """Wrap ``model`` as ``par`` says."""
    if par.method == "ddp":
        return apply_ddp(model)
    if par.method == "fsdp1":
        return apply_fsdp(model, par.strategy, par.shard_size)
    return apply_fsdp2(model, par.reshard_after_forward, par.shard_size)


def native_bf16(capability: tuple[int, int]) -> bool:
    """Whether an NVIDIA GPU of this compute capability computes bf16 natively: 8.0 (A100) and
    later. Older GPUs (T4: 7.5, V100: 7.0) only emulate it, many times slower."""
    return tuple(capability) >= (8, 0)


def amp_dtype(dev: torch.device) -> torch.dtype:
    """The 16-bit type of mixed precision on ``dev``: bf16 where the hardware computes it (CPUs,
    GPUs with ``native_bf16``), fp16 on older GPUs. A GPU device without an index is the current
    one, which is the rank's own once ``launch.spawn`` or ``torchrun.worker`` has set it. fp16
    needs loss scaling: see ``grad_scaler``."""
    if dev.type == "cuda" and not torch.version.hip \
            and not native_bf16(torch.cuda.get_device_capability(dev)):
        return torch.float16
    return torch.bfloat16


@dataclass(frozen=True)
class Precision:
    """The mixed precision of a training step on one device (``mixed_precision`` chooses it):
    ``dtype`` is what autocast computes in, ``None`` for no autocast."""

    device_type: str
    dtype: torch.dtype | None

    def autocast(self):
        """``torch.autocast`` in ``dtype``, or an empty context without autocast."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scaler(self, fsdp1: bool = False):
        """``grad_scaler`` for this precision: enabled for fp16 only."""
        return grad_scaler(torch.device(self.device_type), self.dtype, fsdp1)

    @property
    def loss_scaling(self) -> bool:
        return self.dtype == torch.float16

    @property
    def name(self) -> str | None:
        """``"bfloat16"``, ``"float16"``, or ``None`` without autocast."""
        return dtype_name(self.dtype)


def mixed_precision(dev: torch.device, enabled: bool = True) -> Precision:
    """The autocast of every training script of the book: on a GPU, ``amp_dtype(dev)`` (bf16 where
    it is native, else fp16 with a ``GradScaler``); on the CPU none (the small models of the CPU
    mode gain nothing from it, and the float64 comparisons need full precision); none either
    when not ``enabled`` (a script's ``--no-amp``)."""
    if dev.type != "cuda" or not enabled:
        return Precision(dev.type, None)
    return Precision("cuda", amp_dtype(dev))


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``"bfloat16"`` for ``torch.bfloat16``: how a run reports a dtype (``None`` stays)."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def grad_scaler(dev: torch.device, dtype: torch.dtype | None, fsdp1: bool = False):
    """A gradient scaler for a step computed in ``dtype`` on ``dev``, enabled only for fp16:
    its 5 exponent bits flush small gradients to zero unless the loss is scaled up first. For
    bf16, fp32 or no autocast (``None``) it is disabled, and ``scale``, ``step`` and ``update``
    pass straight through, so one loop serves every case. Each rank of FSDP holds a shard of
    the gradients, so an inf found on one rank must skip the step on all: FSDP1 needs
    ``ShardedGradScaler`` for that, FSDP2's DTensor gradients do it inside ``GradScaler``."""
    from torch.amp import GradScaler
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    cls = ShardedGradScaler if fsdp1 else GradScaler
    return cls(dev.type, enabled=dtype == torch.float16)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, reduction: str = "mean", grads_out: list | None = None) -> float:
    """One step of mean-squared-error regression (``reduction`` over the rank's batch); returns
    this rank's loss. If ``grads_out`` is a list, the flat gradient that the optimizer applies
    (after DDP's AllReduce) is appended to it."""
    loss = loss_fn(model(x), y, reduction)
    loss.backward()
    if grads_out is not None:
        grads_out.append(flat_grad(model))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def cpu_copy(obj):
    """``obj`` (a tensor, or a state dict of nested dicts, lists and tuples) with every tensor
    replaced by a detached copy on the CPU: a snapshot that later training steps cannot change,
    and a file that names no GPU and loads on any machine."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded parameters under their original names (no ``module.`` prefix, no FSDP
    flat parameters), on every rank, on the CPU; works for a plain, DDP, FSDP1 or FSDP2 model."""
    if not dist.is_initialized():
        return cpu_copy(model.state_dict())
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return cpu_copy(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))


def build_model(par: Parallel | None, world_size: int, model_kwargs: dict | None = None,
                dtype: torch.dtype = torch.float64, sync_batchnorm: bool = False):
    """The chapter's MLP (``models.build_mlp(**model_kwargs)``) in ``dtype``, its BatchNorm
    layers turned into ``SyncBatchNorm`` if ``sync_batchnorm``, then wrapped as ``par`` says
    (``None``: one process, not wrapped). Returns ``(model, wrapped)``."""
    from .models import build_mlp

    if par is None and world_size != 1:
        raise ValueError("par=None (không song song) chỉ dùng với world_size=1.")
    model = build_mlp(**(model_kwargs or {})).to(dtype)
    if sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model, (model if par is None else apply_parallel(model, par))


def fit(rank: int = 0, world_size: int = 1, par: Parallel | None = None, steps: int = 5,
        batch_size: int = 8, lr: float = 0.05, model_kwargs: dict | None = None,
        dtype: torch.dtype = torch.float64, sync_batchnorm: bool = False,
        reduction: str = "mean", record: bool = False) -> dict:
    """Train a small MLP with SGD on synthetic data; usable as a ``launch.spawn`` rank function.

    Each step takes the next global batch of ``batch_size * world_size`` samples; rank ``r``
    trains on its ``r``-th slice. With ``par=None`` (one process, ``world_size=1``) the same
    code is the single-process reference: same initial weights, same global batches. Returns
    the per-step losses of this rank and the full final weights (buffers included).
    ``sync_batchnorm=True`` converts BatchNorm layers to ``SyncBatchNorm`` before wrapping
    (PyTorch accepts this only for inputs on a GPU). ``reduction="sum"`` sums the loss over the
    rank's batch instead of averaging it. ``record=True`` (DDP or one process) also returns
    ``grads``, the flat gradient applied at the first step, and, for a model with BatchNorm,
    ``bn``: the statistics its first BatchNorm layer normalised with at the first step on this
    rank and over all ranks (see ``first_batchnorm_stats``).
    """
    from .data import rank_batch, synthetic_regression

    if record and par is not None and par.method != "ddp":
        raise ValueError("record=True chỉ dùng với một process (par=None) hoặc DDP: với FSDP, "
                         "mỗi rank chỉ giữ một mảnh gradient.")
    model, wrapped = build_model(par, world_size, model_kwargs, dtype, sync_batchnorm)
    dev = next(wrapped.parameters()).device
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=lr)
    global_batch = batch_size * world_size
    ds = synthetic_regression(steps * global_batch, model.blocks[0].linear.in_features,
                              model.head.out_features)
    x_all, y_all = (t.to(dtype) for t in ds.tensors)
    losses, grads = [], []
    seen = record_batchnorm_input(model) if record else []
    for step in range(steps):
        x, y = rank_batch((x_all, y_all), rank, batch_size, dev, start=step * global_batch)
        out = grads if record and step == 0 else None
        losses.append(train_step(wrapped, optimizer, x, y, reduction, grads_out=out))
    result = {"losses": losses, "state": full_state_dict(wrapped)}
    if record:
        result["grads"] = grads[0]
        if seen:
            result["bn"] = first_batchnorm_stats(seen[0])
    return result


def record_batchnorm_input(model: nn.Module) -> list:
    """Hook the first BatchNorm layer of ``model``: the returned list receives its first input
    (the activations it normalises at the first step); stays empty for a model without one."""
    seen: list = []
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.register_forward_pre_hook(
                lambda _m, args: None if seen else seen.append(args[0].detach()))
            break
    return seen


def first_batchnorm_stats(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-feature mean and biased variance of ``x`` (a BatchNorm input, samples x features) on
    this rank (``mean``, ``var``) and over the samples of every rank (``global_mean``,
    ``global_var``): the count, the sum and the sum of squares are all-reduced, which is the
    agreement ``SyncBatchNorm`` reaches before normalising."""
    c = x.shape[1]
    s = torch.cat([x.new_tensor([x.shape[0]]), x.sum(0), (x * x).sum(0)])
    if dist.is_initialized():
        dist.all_reduce(s)
    global_mean = s[1:c + 1] / s[0]
    stats = {"mean": x.mean(0), "var": x.var(0, unbiased=False), "global_mean": global_mean,
             "global_var": s[c + 1:] / s[0] - global_mean**2}
    return {k: v.cpu() for k, v in stats.items()}
