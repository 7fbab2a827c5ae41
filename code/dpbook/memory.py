"""The VRAM ledger: bytes of training state per rank, by strategy, precision and optimizer.

Conventions, following the ZeRO paper (Rajbhandari et al., 2020):

* ``precision="fp32"``: parameters 4 B, gradients 4 B, optimizer state K B per parameter
  (Adam: K = 8, the two moments; SGD with momentum: K = 4; plain SGD: K = 0).
* ``precision="mixed"``: the paper's 2 + 2 + K with K = 12 for Adam: bf16/fp16 parameters and
  gradients, and an fp32 master copy of the weights (4 B) that lives with the optimizer state,
  next to the two fp32 moments; 16 B per parameter in all.
* ``precision="mixed_fp32_grads"``: the same, but gradients are accumulated in fp32 (4 B), as
  when gradient accumulation runs in full precision: 18 B per parameter.

Sharding divides terms by the number of ranks that share them:

========================  ==========  =========  ================
strategy                  parameters  gradients  optimizer state
========================  ==========  =========  ================
DDP, NO_SHARD             full        full       full
ZeRO-1                    full        full       / N
ZeRO-2                    full        / N        / N
ZeRO-3, FULL_SHARD        / N         / N        / N
SHARD_GRAD_OP             see phase   / N        / N
HYBRID_SHARD              / S         / S        / S   (S = shard group size)
========================  ==========  =========  ================

``phase="rest"`` is what a rank holds between steps (after ``optimizer.step()``): FSDP's
SHARD_GRAD_OP has resharded its parameters by then (/ N). ``phase="step"`` is what it holds
during forward and backward, where SHARD_GRAD_OP keeps full parameters (that is its ZeRO-2
trade: no AllGather in backward), and FULL_SHARD additionally materialises the full
parameters of the unit being computed (``largest_unit_params``) and those of the root unit
(``root_unit_params``: embeddings, final norm, head), which FSDP gathers before the first
layer and reshards only after the whole backward. Prefetching the next unit can add one more
unit: the ledger counts one, a lower bound.

``zero_redundancy_ledger`` is a row apart: ZeRO-1 as PyTorch runs it, DDP with
``torch.distributed.optim.ZeroRedundancyOptimizer`` (``torch/distributed/optim/
zero_redundancy_optimizer.py``). ``_partition_parameters`` gives each rank whole parameter
tensors (largest first, to the rank holding the fewest elements so far) and
``_init_local_optimizer`` builds the wrapped optimizer on that rank's tensors only, so only the
optimizer's own state (Adam's m and v, ``K`` bytes per parameter) is divided by N; ``step``
runs the local step and then ``_sync_params``, which broadcasts every rank's ``param.data`` in
the parameter's dtype. PyTorch keeps no fp32 master copy: with ``torch.autocast`` the
parameters and their gradients stay fp32 and whole on every rank. So a rank holds
``4P + 4P + KP/N`` (Adam: ``8P + 8P/N``), whatever the job's precision, where the paper's
"ZeRO-1" row, mixed, holds ``2P + 2P + 12P/N``. ``KP/N`` is the even share; whole tensors make
the heaviest rank hold a little more. Like the DDP row, it counts DDP's bucket copy of the
gradients in ``Ledger.buffers`` (``4P``; none with ``bucket_view=True``).

DDP's buckets (``Ledger.buffers``): ``DistributedDataParallel`` builds a ``Reducer`` whose
``initialize_buckets`` (torch/csrc/distributed/c10d/reducer.cpp) allocates one flat
``bucket.gradients`` tensor per bucket, in the gradients' dtype, and copies each gradient into
it before the AllReduce: a second copy of the gradients that lives as long as the model. With
``gradient_as_bucket_view=True`` the gradients are views into those buckets and the copy is gone
(``bucket_view=True``). So DDP holds ``16P + 4P = 20P`` by default in fp32 with Adam
(``measure.state_bytes`` measures it). The paper's ZeRO rows and FSDP count no such buffer
(``buffers`` is 0): theirs (DeepSpeed's fixed-size buckets, FSDP's per-unit AllGather and
ReduceScatter buffers) do not grow with the whole model.

Activations are not state: they depend on batch size, sequence length and checkpointing, so
the caller passes them as ``activation_bytes`` (the ledger does not guess them).
``checkpointed_activation_bytes`` says what activation checkpointing leaves of them (one
checkpointed region per block: each block keeps only its input, and backward recomputes one
block at a time).

CPU offload (``offload=True``, FSDP's ``CPUOffloadPolicy``) moves the sharded state, parameters,
gradients and optimizer state, to the host: ``Ledger.host`` (not in ``total``, which is what the
GPU holds). On the GPU remain only the parameters FSDP gathers (at ``phase="step"``: every
parameter with SHARD_GRAD_OP, the unit being computed and the root unit otherwise). Like every
row of the ledger, this does not count the transient unsharded gradient of the unit whose
ReduceScatter is pending: a lower bound.

A card (``Card``, ``CARDS``) is what the bytes are compared against: an "80 GB" card holds
80 GiB, of which the driver reports a little less as the total and the process's CUDA context
takes a little more; ``fits`` compares with what is left, ``Card.usable_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import int_at_least, non_negative, one_of
from .style import GIB

STRATEGIES = ("DDP", "NO_SHARD", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FULL_SHARD", "SHARD_GRAD_OP",
              "HYBRID_SHARD")
PRECISIONS = ("fp32", "mixed", "mixed_fp32_grads")
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd_momentum")
PHASES = ("rest", "step")
OFFLOAD_STRATEGIES = ("SHARD_GRAD_OP", "FULL_SHARD", "ZeRO-3", "HYBRID_SHARD")  # FSDP's
# Of a Transformer block's activations, the part that is its input: 2sbh bytes (the hidden
# state in 16 bits; s sequence, b micro-batch, h hidden size, a heads) of sbh(34 + 5as/h), the
# count of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
# Models": a GPT layer with a 4h MLP and dropout; with full recomputation only the 2sbh input of
# each layer is kept), without the 5as/h term of the s x s attention scores, which an attention
# kernel such as FlashAttention does not store: 2/34. A LLaMA layer (SwiGLU, no dropout) differs
# a little; callers may pass their own fraction.
CHECKPOINT_KEPT_FRACTION = 2 / 34

# (param bytes, grad bytes, master-weight bytes) per parameter
_PRECISION_BYTES = {"fp32": (4, 4, 0), "mixed": (2, 2, 4), "mixed_fp32_grads": (2, 4, 4)}
# fp32 optimizer state per parameter, excluding master weights
_OPTIMIZER_BYTES = {"adam": 8, "adamw": 8, "sgd": 0, "sgd_momentum": 4}
# ZeroRedundancyOptimizer: parameters (and so gradients) in their own dtype, fp32, also under
# autocast; it broadcasts ``param.data`` in that dtype (``_broadcast_params_from_rank``)
ZERO_REDUNDANCY_PARAM_BYTES = 4
# which of (params, grads, optimizer) are sharded, for each strategy
_SHARDED = {
    "DDP": (False, False, False), "NO_SHARD": (False, False, False),
    "ZeRO-1": (False, False, True), "ZeRO-2": (False, True, True),
    "ZeRO-3": (True, True, True), "FULL_SHARD": (True, True, True),
    "SHARD_GRAD_OP": (True, True, True), "HYBRID_SHARD": (True, True, True),
}


@dataclass(frozen=True)
class Ledger:
    """Bytes per rank. ``optimizer`` includes fp32 master weights in mixed precision."""

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0
    host: float = 0.0  # bytes of this rank's state kept in host (CPU) memory: CPU offload
    # Communication buffers that live as long as the model: DDP's buckets, a second copy of the
    # gradients unless ``gradient_as_bucket_view=True`` (torch/csrc/distributed/c10d/reducer.cpp,
    # ``Reducer::initialize_buckets``: one flat ``bucket.gradients`` tensor per bucket).
    buffers: float = 0.0

    @property
    def state(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.state + self.buffers + self.activations


def bytes_per_param(precision: str = "fp32", optimizer: str = "adam") -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state incl. master weights) bytes for one parameter."""
    one_of("precision", precision, PRECISIONS)
    one_of("optimizer", optimizer, OPTIMIZERS)
    p, g, master = _PRECISION_BYTES[precision]
    return p, g, master + _OPTIMIZER_BYTES[optimizer]


def zero_redundancy_bytes(optimizer: str = "adam") -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes for one parameter with
    ``ZeroRedundancyOptimizer`` as PyTorch runs it: fp32 parameters and gradients (also under
    ``torch.autocast``), the wrapped optimizer's own state and no master copy."""
    one_of("optimizer", optimizer, OPTIMIZERS)
    return ZERO_REDUNDANCY_PARAM_BYTES, ZERO_REDUNDANCY_PARAM_BYTES, _OPTIMIZER_BYTES[optimizer]


def zero_redundancy_ledger(num_params: int, world_size: int = 1, *, optimizer: str = "adam",
                           activation_bytes: float = 0.0, bucket_view: bool = False) -> Ledger:
    """Bytes on one rank with DDP and ``ZeroRedundancyOptimizer``: parameters and gradients
    whole, the optimizer state divided by ``world_size`` (``zero_redundancy_bytes``), and DDP's
    bucket copy of the gradients (none with ``bucket_view``)."""
    int_at_least("num_params", num_params)
    int_at_least("world_size", world_size)
    non_negative("activation_bytes", activation_bytes)
    _check_bool("bucket_view", bucket_view)
    bp, bg, bo = zero_redundancy_bytes(optimizer)
    return Ledger(params=float(num_params * bp), grads=float(num_params * bg),
                  optimizer=num_params * bo / world_size, activations=float(activation_bytes),
                  buffers=0.0 if bucket_view else float(num_params * bg))


def vram_ledger(num_params: int, world_size: int = 1, strategy: str = "DDP", *,
                precision: str = "fp32", optimizer: str = "adam", phase: str = "rest",
                shard_size: int | None = None, largest_unit_params: int = 0,
                root_unit_params: int = 0, activation_bytes: float = 0.0,
                offload: bool = False, bucket_view: bool = False) -> Ledger:
    """Bytes of parameters, gradients and optimizer state on one rank (``offload``: on the GPU,
    with the sharded state in ``Ledger.host``), and for ``"DDP"`` the bucket copy of the
    gradients in ``Ledger.buffers`` (none with ``bucket_view``, DDP's
    ``gradient_as_bucket_view=True``)."""
    _validate(num_params, world_size, strategy, phase, shard_size,
              (largest_unit_params, root_unit_params), activation_bytes)
    _validate_offload(offload, strategy)
    _check_bool("bucket_view", bucket_view)
    bp, bg, bo = bytes_per_param(precision, optimizer)
    n = shard_size if strategy == "HYBRID_SHARD" else world_size
    if offload:
        return _offloaded(num_params, n, strategy, phase, (bp, bg, bo),
                          largest_unit_params + root_unit_params, activation_bytes)
    shard_p, shard_g, shard_o = _SHARDED[strategy]
    params = num_params * bp / (n if shard_p else 1)
    if phase == "step" and strategy == "SHARD_GRAD_OP":
        params = num_params * bp
    elif phase == "step" and strategy in ("FULL_SHARD", "ZeRO-3", "HYBRID_SHARD"):
        params += (largest_unit_params + root_unit_params) * bp * (n - 1) / n
    return Ledger(params=params,
                  grads=num_params * bg / (n if shard_g else 1),
                  optimizer=num_params * bo / (n if shard_o else 1),
                  activations=float(activation_bytes),
                  buffers=float(num_params * bg) if strategy == "DDP" and not bucket_view else 0.0)


def _offloaded(num_params, n, strategy, phase, sizes, gathered, activation_bytes) -> Ledger:
    """CPU offload: the sharded state on the host; on the GPU, what FSDP gathers in the step
    (``CPUOffloadPolicy``: sharded parameters are copied host-to-device before each AllGather,
    sharded gradients device-to-host after the ReduceScatter, and the optimizer steps on CPU)."""
    bp, bg, bo = sizes
    if phase == "rest":
        params = 0.0
    else:
        params = float(num_params * bp if strategy == "SHARD_GRAD_OP" else gathered * bp)
    return Ledger(params=params, grads=0.0, optimizer=0.0, activations=float(activation_bytes),
                  host=num_params * (bp + bg + bo) / n)


def checkpointed_activation_bytes(activation_bytes: float, num_blocks: int,
                                  kept_fraction: float = CHECKPOINT_KEPT_FRACTION) -> float:
    """Activations per GPU with activation checkpointing of every block, from the activations
    ``activation_bytes`` without it, spread evenly over ``num_blocks`` equal blocks of which
    each keeps its input, a ``kept_fraction`` of its activations: ``A (f + 1/L)``. The forward
    keeps the L inputs (``f A``); the backward recomputes one block at a time, whose
    activations (``A / L``) exist again while its gradient is computed. Activations outside the
    blocks (embeddings, the loss) are taken as spread over them like the rest."""
    non_negative("activation_bytes", activation_bytes)
    int_at_least("num_blocks", num_blocks)
    if isinstance(kept_fraction, bool) or not isinstance(kept_fraction, (int, float)) \
            or not 0 < kept_fraction <= 1:
        raise ValueError(f"kept_fraction là phần activation của một khối mà khối giữ lại (đầu vào "
                         f"của nó), phải nằm trong (0, 1], nhận được {kept_fraction!r}.")
    return activation_bytes * (kept_fraction + 1 / num_blocks)


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} phải là True hoặc False, nhận được {value!r}.")


def _validate_offload(offload, strategy) -> None:
    _check_bool("offload", offload)
    if offload and strategy not in OFFLOAD_STRATEGIES:
        raise ValueError(
            f"offload=True chỉ dùng được với các chiến lược FSDP {OFFLOAD_STRATEGIES} "
            f"(CPUOffloadPolicy); PyTorch không có CPU offload cho {strategy}, nhận được "
            f"strategy={strategy!r}.")


def _validate(num_params, world_size, strategy, phase, shard_size, gathered,
              activation_bytes) -> None:
    int_at_least("num_params", num_params)
    int_at_least("world_size", world_size)
    one_of("strategy", strategy, STRATEGIES)
    one_of("phase", phase, PHASES)
    if strategy == "HYBRID_SHARD" and (
        not isinstance(shard_size, int) or shard_size < 1 or world_size % shard_size
    ):
        raise ValueError(
            f"HYBRID_SHARD cần shard_size là ước số nguyên dương của world_size={world_size} "
            f"(thường là số GPU mỗi máy), nhận được {shard_size!r}."
        )
    unit, root = gathered
    if not (isinstance(unit, int) and isinstance(root, int) and unit >= 0 and root >= 0
            and unit + root <= num_params):
        raise ValueError(
            "largest_unit_params và root_unit_params phải là số nguyên không âm, tổng (số tham "
            f"số gom về cùng lúc) không quá num_params={num_params}; nhận được {unit!r} và "
            f"{root!r}."
        )
    non_negative("activation_bytes", activation_bytes)


# --- the cards: what "80 GB" holds, and how much of it PyTorch can allocate

# A CUDA context with lazy module loading (PyTorch's default since 1.13): 287 047 680 B, against
# 666 632 192 B when every module is loaded eagerly, as measured in PyTorch pull request #86509
# ("Sets CUDA_MODULE_LOADING to LAZY when not set by the user"). A lower bound: the cuBLAS
# workspace, NCCL's buffers and kernels loaded later come on top (``Job.headroom`` in 4.1.8).
CUDA_CONTEXT_BYTES = 287_047_680
# An H100 80GB as PyTorch's out-of-memory message reports it: "GPU 0 has a total capacity of
# 79.11 GiB" (vllm-project/vllm issue #27508; the figure is cudaMemGetInfo's total, printed to
# 0,01 GiB). The driver keeps the rest of the card's 80 GiB.
H100_TOTAL_BYTES = round(79.11 * 2**30)


@dataclass(frozen=True)
class Card:
    """A GPU's memory. ``marketed_gb`` is the number in the name ("80 GB"): the chips hold that
    many GiB (2³⁰ B), ``capacity_bytes``. ``total_bytes`` is what ``torch.cuda.mem_get_info()``
    reports as total (cudaMemGetInfo): the capacity less what the driver reserves. PyTorch can
    allocate ``usable_bytes``: the total less the process's CUDA context. ``source`` says where
    ``total_bytes`` comes from."""

    name: str
    marketed_gb: int
    total_bytes: int
    source: str
    context_bytes: int = CUDA_CONTEXT_BYTES

    def __post_init__(self):
        int_at_least("marketed_gb", self.marketed_gb)
        int_at_least("total_bytes", self.total_bytes)
        int_at_least("context_bytes", self.context_bytes, 0)
        if not self.context_bytes < self.total_bytes <= self.capacity_bytes:
            raise ValueError(
                f"Card {self.name!r}: cần context_bytes < total_bytes <= marketed_gb GiB "
                f"({self.capacity_bytes} B); nhận được context_bytes={self.context_bytes}, "
                f"total_bytes={self.total_bytes}.")

    @property
    def capacity_bytes(self) -> int:
        """What the chips hold: the marketed number in GiB."""
        return self.marketed_gb * GIB

    @property
    def driver_reserved_bytes(self) -> int:
        return self.capacity_bytes - self.total_bytes

    @property
    def usable_bytes(self) -> int:
        """What PyTorch can allocate: the reported total less the CUDA context."""
        return self.total_bytes - self.context_bytes


def _gib(x: float) -> int:
    """A total as PyTorch's out-of-memory message prints it (GiB, two decimals), in bytes."""
    return round(x * GIB)


# The cards the book compares against, smallest first. The 80 GB line is the H100's figure
# (an A100 80GB reports about the same); the H200's total is not a measurement: it applies the
# H100's reported fraction (total / capacity) to 141 GiB.
CARDS = (
    Card("RTX 4090", 24, _gib(23.68),
         "thông báo hết bộ nhớ của PyTorch trên RTX 4090, tổng 23,68 GiB "
         "(github.com/zai-org/CogVideo/issues/36)"),
    Card("A100 40GB", 40, _gib(39.50),
         "thông báo hết bộ nhớ của PyTorch trên A100 40GB, tổng 39,50 GiB "
         "(github.com/TianheWu/CoSeR/issues/10)"),
    Card("H100 80GB", 80, H100_TOTAL_BYTES,
         "thông báo hết bộ nhớ của PyTorch trên H100 80GB, tổng 79,11 GiB "
         "(github.com/vllm-project/vllm/issues/27508)"),
    Card("H200", 141, round(141 * GIB * H100_TOTAL_BYTES / (80 * GIB)),
         "ước lượng: 141 GiB nhân tỷ lệ total / dung lượng mà H100 báo (chưa đo)"),
)


def card(name: str) -> Card:
    """The card of ``CARDS`` called ``name``."""
    names = {c.name: c for c in CARDS}
    one_of("card", name, names)
    return names[name]


def fits(nbytes: float, gpu: Card) -> bool:
    """Whether ``nbytes`` per rank fit in what PyTorch can allocate on ``gpu``."""
    if not isinstance(gpu, Card):
        raise ValueError(f"gpu phải là một memory.Card (ví dụ memory.card(\"H100 80GB\")), nhận "
                         f"được {gpu!r}.")
    non_negative("nbytes", nbytes)
    return nbytes <= gpu.usable_bytes
