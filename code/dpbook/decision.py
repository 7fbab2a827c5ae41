"""The decision rule of section 4.1.8 (choosing DDP or FSDP), with the numbers behind it.

A ``Job`` describes a training run (model size, GPUs, precision, optimizer, an activation
allowance). ``recommend(job)`` prices the candidates with the package's own formulas,
``memory.vram_ledger`` for bytes per GPU and ``costs`` for bytes per step, and climbs the
ladder of the decision rule (``LADDER``, the page's "Quy tắc quyết định"):

1. DDP if the whole training state (plus activations) fits one GPU;
2. on one node, the rungs that shard without leaving it, in order: ZeRO-1 (DDP with
   ``ZeroRedundancyOptimizer``: only the optimizer state is sharded), ``SHARD_GRAD_OP``
   (ZeRO-2), ``FULL_SHARD`` (ZeRO-3); the first that fits;
3. across nodes: ``HYBRID_SHARD`` (HSDP, one node as the shard group) if the state sharded
   inside one node fits, else ``FULL_SHARD`` over every GPU;
4. if even that does not fit, the reason says which of activation checkpointing (the sharded
   state fits, the activations do not) or CPU offload / more GPUs (the state itself does not)
   comes next.

Memory is taken at ``phase="step"``: FSDP then also holds the full parameters of the layer it is
computing (``largest_unit_params``) and of the root unit (``root_unit_params``), and
SHARD_GRAD_OP every parameter. A GPU is a ``memory.Card``: of an "80 GB" card (80 GiB) PyTorch
can allocate ``Card.usable_bytes``, what the driver reports less the CUDA context; a
``headroom`` fraction of that is kept free for allocator fragmentation, communication buffers
and library workspaces.

Traffic uses ``Psi = comm_bytes``: 2 bytes per parameter in mixed precision, which is what DDP
sends with a 16-bit compression hook and FSDP with ``reduce_dtype=torch.bfloat16``; with DDP
under plain autocast and FSDP with ``reduce_dtype=torch.float32``, see ``PRECISION_SETTINGS``.
Inter-node traffic is counted per node under the ring model: a ring over all ranks, ordered by
node, crosses each node boundary once, and that link carries what one rank sends. HYBRID_SHARD
runs one ring AllReduce per position in the node (``shard_size`` of them), each over the nodes.

The rule lives here, in the formula layer, so that the page (``pages.ddp_or_fsdp``, which
re-exports it) and the calculator of the HTML book (``widgets.calculator``) use one copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import costs, memory, vi
from .checks import int_at_least, non_negative, one_of
from .memory import Card
from .style import GB

CANDIDATES = ("DDP", "ZeRO-1", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
IN_NODE = ("ZeRO-1", "SHARD_GRAD_OP", "FULL_SHARD")  # rung 2, in this order
LADDER = ("DDP",) + IN_NODE + ("HYBRID_SHARD", "FULL_SHARD")
# What a reader sees for each candidate.
LABELS = {"DDP": "DDP", "ZeRO-1": "ZeRO-1 (ZeroRedundancyOptimizer)",
          "SHARD_GRAD_OP": "FSDP SHARD_GRAD_OP", "FULL_SHARD": "FSDP FULL_SHARD",
          "HYBRID_SHARD": "FSDP HYBRID_SHARD"}


@dataclass(frozen=True)
class Job:
    """A training job: ``num_params`` on ``nodes`` x ``gpus_per_node`` cards ``gpu``."""

    num_params: int
    gpu: Card
    gpus_per_node: int = 8
    nodes: int = 1
    precision: str = "mixed"
    optimizer: str = "adam"
    activation_gb: float = 0.0  # GB (10⁹ B) of activations per GPU, an allowance the caller picks
    largest_unit_params: int = 0  # the biggest layer unit (one Transformer layer)
    headroom: float = 0.1  # fraction of what PyTorch can allocate that is kept free
    name: str = ""
    root_unit_params: int = 0  # what the root unit keeps: embeddings, final norm, head

    def __post_init__(self):
        int_at_least("num_params", self.num_params)
        int_at_least("gpus_per_node", self.gpus_per_node)
        int_at_least("nodes", self.nodes)
        one_of("precision", self.precision, memory.PRECISIONS)
        one_of("optimizer", self.optimizer, memory.OPTIMIZERS)
        non_negative("activation_gb", self.activation_gb)
        if not isinstance(self.gpu, Card):
            raise ValueError(f"gpu phải là một memory.Card (ví dụ memory.card(\"H100 80GB\"); các "
                             f"card có sẵn: {[c.name for c in memory.CARDS]}), nhận được "
                             f"{self.gpu!r}.")
        for name in ("largest_unit_params", "root_unit_params"):
            if not 0 <= getattr(self, name) <= self.num_params:
                raise ValueError(f"{name} phải nằm trong [0, num_params], nhận được "
                                 f"{getattr(self, name)!r}.")
        if self.largest_unit_params + self.root_unit_params > self.num_params:
            raise ValueError("largest_unit_params + root_unit_params phải không quá num_params.")
        if isinstance(self.headroom, bool) or not isinstance(self.headroom, (int, float)) \
                or not 0 <= self.headroom < 1:
            raise ValueError(f"headroom là phần VRAM để trống, phải nằm trong [0, 1), nhận được "
                             f"{self.headroom!r}.")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def capacity_bytes(self) -> float:
        """What one GPU may hold for training state and activations: what PyTorch can allocate
        on the card, less the headroom."""
        return self.gpu.usable_bytes * (1 - self.headroom)

    @property
    def comm_bytes(self) -> int:
        """Bytes of ``Psi``: parameters as communicated (2 per parameter in mixed precision, the
        16-bit convention, 4 in fp32)."""
        return self.num_params * memory.bytes_per_param(self.precision, self.optimizer)[0]


@dataclass(frozen=True)
class Option:
    """One candidate priced for a job: bytes per GPU, bytes sent per rank and per node per step."""

    strategy: str
    memory_bytes: float
    sent_bytes: float
    internode_bytes: float
    fits: bool


@dataclass(frozen=True)
class Recommendation:
    job: Job
    choice: str | None  # one of CANDIDATES, or None if nothing fits
    reason: str
    options: dict[str, Option] = field(default_factory=dict)


def gb_text(nbytes: float, digits: int = 1) -> str:
    """Gigabytes (10⁹ B) written the Vietnamese way: decimal comma, a plain space between
    thousands (the tables measure text by characters)."""
    return vi.number(nbytes / GB, digits, group=" ")


def step_volume(job: Job, strategy: str) -> costs.StepVolume:
    """Bytes one rank sends per step with ``strategy``. ZeRO-1 is PyTorch's: DDP's AllReduce,
    then ``ZeroRedundancyOptimizer.step`` broadcasts each rank's updated partition of the
    parameters (``_broadcast_params_from_rank``), so that every rank receives the (N-1)/N of
    ``Psi`` it did not update: an AllGather's worth, counted as one before the next forward."""
    n, psi = job.world_size, job.comm_bytes
    if strategy == "ZeRO-1":
        return replace(costs.ddp_step_bytes(psi, n),
                       all_gather_forward=costs.ring_bytes("all_gather", psi, n))
    hybrid = {"shard_size": job.gpus_per_node} if strategy == "HYBRID_SHARD" else {}
    return costs.fsdp_step_bytes(psi, n, strategy, **hybrid)


def price(job: Job, strategy: str) -> Option:
    """Memory per GPU and traffic per step of ``strategy`` for ``job``."""
    one_of("strategy", strategy, CANDIDATES)
    if strategy == "HYBRID_SHARD" and job.nodes < 2:
        raise ValueError("HYBRID_SHARD cần ít nhất 2 node (nodes >= 2).")
    hybrid = {"shard_size": job.gpus_per_node} if strategy == "HYBRID_SHARD" else {}
    ledger = memory.vram_ledger(job.num_params, job.world_size, strategy,
                                precision=job.precision, optimizer=job.optimizer, phase="step",
                                largest_unit_params=job.largest_unit_params,
                                root_unit_params=job.root_unit_params,
                                activation_bytes=job.activation_gb * GB, **hybrid)
    volume = step_volume(job, strategy)
    internode = costs.internode_bytes(volume, strategy, job.nodes, job.gpus_per_node)
    return Option(strategy, ledger.total, volume.total, internode,
                  ledger.total <= job.capacity_bytes)


def recommend(job: Job) -> Recommendation:
    """Climb ``LADDER``; the reason is one Vietnamese sentence with the numbers."""
    opts = {c: price(job, c) for c in CANDIDATES if c != "HYBRID_SHARD" or job.nodes > 1}
    cap, n, s = gb_text(job.capacity_bytes), job.world_size, job.gpus_per_node
    need = f"DDP cần {gb_text(opts['DDP'].memory_bytes)} GB mỗi GPU > {cap} GB dùng được"
    if opts["DDP"].fits:
        return Recommendation(job, "DDP", (
            f"DDP cần {gb_text(opts['DDP'].memory_bytes)} GB mỗi GPU, vừa {cap} GB dùng được: "
            "chọn DDP (mã đơn giản nhất, giao tiếp ít nhất)."), opts)
    if job.nodes == 1:
        tried = []
        for c in IN_NODE:
            if opts[c].fits:
                return Recommendation(job, c, f"{need}; " + "".join(tried) + (
                    f"{c} trên {n} GPU còn {gb_text(opts[c].memory_bytes)} GB: chọn {LABELS[c]}."),
                    opts)
            tried.append(f"{c} vẫn cần {gb_text(opts[c].memory_bytes)} GB; ")
    else:
        hyb, full = opts["HYBRID_SHARD"], opts["FULL_SHARD"]
        if hyb.fits:
            return Recommendation(job, "HYBRID_SHARD", (
                f"{need}; chia trong một node ({s} GPU) còn {gb_text(hyb.memory_bytes)} GB: chọn "
                "FSDP HYBRID_SHARD (HSDP), giữa các node chỉ còn AllReduce trên các shard "
                "gradient."), opts)
        if full.fits:
            return Recommendation(job, "FULL_SHARD", (
                f"{need}; chia trong một node vẫn cần {gb_text(hyb.memory_bytes)} GB; FULL_SHARD "
                f"trên {n} GPU còn {gb_text(full.memory_bytes)} GB: chọn FSDP FULL_SHARD trên mọi "
                "node."), opts)
    return Recommendation(job, None, _beyond_sharding(job, opts["FULL_SHARD"]), opts)


def _beyond_sharding(job: Job, full: Option) -> str:
    """The last rung: is it the activations (checkpointing) or the state itself (offload)?"""
    n, cap = job.world_size, job.capacity_bytes
    state = full.memory_bytes - job.activation_gb * GB
    head = (f"Ngay cả FULL_SHARD trên {n} GPU cũng cần {gb_text(full.memory_bytes)} GB > "
            f"{gb_text(cap)} GB dùng được")
    if state <= cap:
        return (f"{head}; riêng trạng thái đã chia ({gb_text(state)} GB) thì vừa: bật activation "
                "checkpointing (tính lại activation) để giảm khoản activation.")
    return (f"{head}; riêng trạng thái đã chia đã cần {gb_text(state)} GB: chuyển trạng thái ra bộ "
            "nhớ CPU (CPU offload), thêm GPU, hoặc song song mô hình.")
