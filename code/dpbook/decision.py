"""The decision rule of section 4.1.8 (choosing DDP or FSDP), with the numbers behind it.

A ``Job`` describes a training run (model size, GPUs, precision, optimizer, an activation
allowance, what the job allows). ``recommend(job)`` prices every rung of the ladder
(``ladder(job)``) with the package's own formulas, ``memory.vram_ledger`` for bytes per GPU and
``costs`` for bytes per step, and returns the lowest rung that fits, in this order (the page's
"Quy tắc quyết định"):

1. without recomputation or offload: DDP; then, on one node, ZeRO-1 (DDP with
   ``ZeroRedundancyOptimizer``: only the wrapped optimizer's state is sharded), ``SHARD_GRAD_OP``
   (ZeRO-2), ``FULL_SHARD`` (ZeRO-3); on several nodes, ``HYBRID_SHARD`` (HSDP, one node as the
   shard group: it fits when one node holds the sharded state), then ``FULL_SHARD`` over every
   GPU;
2. the same rungs with activation checkpointing (``memory.checkpointed_activation_bytes``: the
   activations shrink to the blocks' inputs plus one block recomputed; a block is an FSDP layer
   unit, ``Job.num_blocks`` of them);
3. the FSDP rungs (``OFFLOADABLE``) with CPU offload (``CPUOffloadPolicy``: the sharded state in
   host memory, ``Job.host_gb`` per node; the GPU keeps what FSDP gathers);
4. the same with both.

A tier the job does not allow (``allow_checkpointing``, ``allow_offload``), or cannot use
(checkpointing needs ``largest_unit_params`` to count the blocks, and activations to shrink), is
skipped. The reason says which rungs did not fit and by how much.

ZeRO-1 is priced as PyTorch runs it, not as the ZeRO paper's stage 1 (the ledger's "ZeRO-1"
row, ``2P + 2P + 12P/N`` in mixed precision, which section 4.1.7 teaches):
``memory.zero_redundancy_ledger``, ``4P + 4P + KP/N + A`` (Adam: ``8P + 8P/N + A``). In
``torch/distributed/optim/zero_redundancy_optimizer.py``, ``_partition_parameters`` assigns whole
parameter tensors to ranks and ``_init_local_optimizer`` builds the wrapped optimizer on this
rank's tensors only, so only its state (``K`` bytes per parameter) is divided; ``step`` then runs
``_sync_params``, which broadcasts ``param.data`` from each owner (``_broadcast_params_from_rank``)
in the parameter's dtype. PyTorch has no fp32 master copy there, and under ``torch.autocast`` the
parameters and gradients stay fp32 and whole on every rank. The DDP rung is the ledger's DDP row,
``16P + A`` with Adam, which is also what DDP under autocast holds (``4P + 4P + 8P``).

Both DDP rungs, DDP and ZeRO-1, assume ``DistributedDataParallel(...,
gradient_as_bucket_view=True)`` (``Job.bucket_view``, True unless the job says otherwise): the
gradients are views into the reducer's buckets (``torch/nn/parallel/distributed.py``, the
``gradient_as_bucket_view`` argument: "the saved memory size will be equal to the total gradients
size"). With PyTorch's default ``False`` (``Job(bucket_view=False)``), the buckets are a second
copy of the gradients, ``4P`` more on both rungs (the ledger's ``Ledger.buffers``);
``DDP_BUCKET_COPY_BYTES`` is that copy per parameter, which ``bucket_copy_bytes`` gives for a
job.

Memory is taken at ``phase="step"``: FSDP then also holds the full parameters of the layer it is
computing (``largest_unit_params``) and of the root unit (``root_unit_params``), and
SHARD_GRAD_OP every parameter. A GPU is a ``memory.Card``: of an "80 GB" card (80 GiB) PyTorch
can allocate ``Card.usable_bytes``, what the driver reports less the CUDA context; a
``headroom`` fraction of that is kept free for allocator fragmentation, communication buffers
and library workspaces (and the same fraction of the host memory, for the rest of the process).

Traffic uses ``Psi = comm_bytes``: 2 bytes per parameter in mixed precision, which is what DDP
sends with a 16-bit compression hook and FSDP with ``reduce_dtype=torch.bfloat16``; with DDP
under plain autocast and FSDP with ``reduce_dtype=torch.float32``, see ``PRECISION_SETTINGS``.
ZeRO-1 adds the broadcasts of the parameters, which no hook compresses: fp32,
``ZERO_BROADCAST_BYTES`` per parameter.
Inter-node traffic is counted per node under the ring model: a ring over all ranks, ordered by
node, crosses each node boundary once, and that link carries what one rank sends. HYBRID_SHARD
runs one ring AllReduce per position in the node (``shard_size`` of them), each over the nodes.
Offload adds PCIe copies per GPU and step (``pcie_bytes``), which the network does not see.

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
IN_NODE = ("ZeRO-1", "SHARD_GRAD_OP", "FULL_SHARD")  # after DDP on one node, in this order
ACROSS_NODES = ("HYBRID_SHARD", "FULL_SHARD")  # after DDP on several nodes, in this order
LADDER = ("DDP",) + IN_NODE + ACROSS_NODES  # the strategies of the first tier, both cases
# The tiers of the ladder, (activation checkpointing, CPU offload), in the order tried.
TIERS = ((False, False), (True, False), (False, True), (True, True))
OFFLOADABLE = ("SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")  # FSDP's CPUOffloadPolicy
# FSDP2 keeps sharded parameters (and gradients) in their original dtype, fp32, and copies
# them as such (``FSDPParam.all_gather_inputs``; ``foreach_reduce``): bytes per element.
OFFLOAD_COPY_BYTES = 4
# ZeroRedundancyOptimizer broadcasts ``param.data`` in the parameter's dtype, fp32 under autocast
# (``_broadcast_params_from_rank``): bytes per parameter.
ZERO_BROADCAST_BYTES = memory.ZERO_REDUNDANCY_PARAM_BYTES
# DDP's reducer copies fp32 gradients into its buckets unless gradient_as_bucket_view=True, which
# both DDP rungs assume: the copy they leave out, bytes per parameter.
DDP_BUCKET_COPY_BYTES = 4
# What a reader sees for each candidate.
LABELS = {"DDP": "DDP", "ZeRO-1": "ZeRO-1 (ZeroRedundancyOptimizer)",
          "SHARD_GRAD_OP": "FSDP SHARD_GRAD_OP", "FULL_SHARD": "FSDP FULL_SHARD",
          "HYBRID_SHARD": "FSDP HYBRID_SHARD"}
NOTHING_FITS = "không phương án nào vừa"


@dataclass(frozen=True)
class Job:
    """A training job: ``num_params`` on ``nodes`` x ``gpus_per_node`` cards ``gpu``."""

    num_params: int
    gpu: Card
    gpus_per_node: int = 8
    nodes: int = 1
    precision: str = "mixed"
    optimizer: str = "adam"
    activation_gb: float = 0.0  # GB (10⁹ B) of activations per GPU without recomputation
    largest_unit_params: int = 0  # the biggest layer unit (one Transformer layer)
    headroom: float = 0.1  # fraction of what PyTorch can allocate that is kept free
    name: str = ""
    root_unit_params: int = 0  # what the root unit keeps: embeddings, final norm, head
    allow_checkpointing: bool = True  # may the job recompute activations?
    allow_offload: bool = True  # may the job keep its sharded state in host memory?
    host_gb: float = 2000.0  # GB (10⁹ B) of host memory per node, for offload (an assumption)
    bucket_view: bool = True  # DDP rungs with gradient_as_bucket_view=True: no bucket copy

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
        for name in ("allow_checkpointing", "allow_offload", "bucket_view"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} phải là True hoặc False, nhận được "
                                 f"{getattr(self, name)!r}.")
        non_negative("host_gb", self.host_gb)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def capacity_bytes(self) -> float:
        """What one GPU may hold for training state and activations: what PyTorch can allocate
        on the card, less the headroom."""
        return self.gpu.usable_bytes * (1 - self.headroom)

    @property
    def host_capacity_bytes(self) -> float:
        """What offload may put in one node's host memory: ``host_gb`` less the headroom."""
        return self.host_gb * GB * (1 - self.headroom)

    @property
    def comm_bytes(self) -> int:
        """Bytes of ``Psi``: parameters as communicated (2 per parameter in mixed precision, the
        16-bit convention, 4 in fp32)."""
        return self.num_params * memory.bytes_per_param(self.precision, self.optimizer)[0]

    @property
    def num_blocks(self) -> int:
        """``L``, the blocks activation checkpointing wraps, one per FSDP layer unit:
        ``(P - P_root) // P_unit``, exact when the layers are equal, fewer otherwise (which
        overstates the block recomputed: a safe side); 0 when ``largest_unit_params`` is 0."""
        if not self.largest_unit_params:
            return 0
        return (self.num_params - self.root_unit_params) // self.largest_unit_params

    @property
    def can_checkpoint(self) -> bool:
        """Whether the checkpointing tier is tried: allowed, blocks known, activations to cut."""
        return self.allow_checkpointing and self.num_blocks > 0 and self.activation_gb > 0

    def activation_bytes(self, checkpointing: bool = False) -> float:
        """Activations per GPU, with or without checkpointing every block."""
        full = self.activation_gb * GB
        return memory.checkpointed_activation_bytes(full, self.num_blocks) if checkpointing \
            else full


@dataclass(frozen=True)
class Option:
    """One rung priced for a job: bytes per GPU, bytes sent per rank and per node per step, and
    with offload the host bytes per node and the PCIe bytes per GPU per step."""

    strategy: str
    memory_bytes: float
    sent_bytes: float
    internode_bytes: float
    fits: bool
    checkpointing: bool = False
    offload: bool = False
    host_bytes: float = 0.0  # per node: the sharded state offload keeps in host memory
    pcie_bytes: float = 0.0  # per GPU and step: host-to-device plus device-to-host copies

    @property
    def label(self) -> str:
        """The rung as a reader sees it: ``FSDP FULL_SHARD + activation checkpointing``."""
        return (LABELS[self.strategy]
                + (" + activation checkpointing" if self.checkpointing else "")
                + (" + CPU offload" if self.offload else ""))


@dataclass(frozen=True)
class Recommendation:
    job: Job
    choice: str | None  # the chosen rung's strategy, one of CANDIDATES, or None if none fits
    reason: str
    options: dict[str, Option] = field(default_factory=dict)  # each strategy, first tier
    ladder: tuple[Option, ...] = ()  # every rung of ladder(job), priced, in order
    chosen: Option | None = None  # the lowest rung of ``ladder`` that fits

    @property
    def checkpointing(self) -> bool:
        return self.chosen is not None and self.chosen.checkpointing

    @property
    def offload(self) -> bool:
        return self.chosen is not None and self.chosen.offload

    @property
    def label(self) -> str:
        return self.chosen.label if self.chosen else NOTHING_FITS


def gb_text(nbytes: float, digits: int = 1) -> str:
    """Gigabytes (10⁹ B) written the Vietnamese way: decimal comma, thousands grouped by a
    narrow no-break space (``vi.NARROW_NBSP``), as in the book's prose and printed outputs."""
    return vi.number(nbytes / GB, digits, group=vi.NARROW_NBSP)


def ladder(job: Job) -> tuple[tuple[str, bool, bool], ...]:
    """The rungs ``recommend`` tries, lowest first: ``(strategy, checkpointing, offload)``."""
    base = ("DDP",) + (IN_NODE if job.nodes == 1 else ACROSS_NODES)
    rungs = []
    for ckpt, off in TIERS:
        if (ckpt and not job.can_checkpoint) or (off and not job.allow_offload):
            continue
        rungs += [(s, ckpt, off) for s in base if not off or s in OFFLOADABLE]
    return tuple(rungs)


def bucket_copy_bytes(job: Job) -> float:
    """What DDP's default ``gradient_as_bucket_view=False`` adds to both DDP rungs (DDP and
    ZeRO-1) on each GPU: the buckets' fp32 copy of the gradients, which ``price`` leaves out
    unless ``Job(bucket_view=False)``."""
    return DDP_BUCKET_COPY_BYTES * job.num_params


def step_volume(job: Job, strategy: str) -> costs.StepVolume:
    """Bytes one rank sends per step with ``strategy``. ZeRO-1 is PyTorch's: DDP's AllReduce of
    ``Psi``, then ``ZeroRedundancyOptimizer.step`` broadcasts each rank's updated partition of
    the parameters (``_broadcast_params_from_rank``: ``param.data``, fp32), so that every rank
    receives the (N-1)/N of the ``4P`` bytes it did not update: an AllGather's worth of fp32
    parameters, counted as one before the next forward. ``2(N-1)/N Psi + (N-1)/N 4P``."""
    n, psi = job.world_size, job.comm_bytes
    if strategy == "ZeRO-1":
        params = ZERO_BROADCAST_BYTES * job.num_params
        return replace(costs.ddp_step_bytes(psi, n),
                       all_gather_forward=costs.ring_bytes("all_gather", params, n))
    hybrid = {"shard_size": job.gpus_per_node} if strategy == "HYBRID_SHARD" else {}
    return costs.fsdp_step_bytes(psi, n, strategy, **hybrid)


def pcie_bytes(job: Job, strategy: str) -> float:
    """Bytes one GPU copies over PCIe per step with CPU offload: its fp32 shard of the
    parameters host-to-device before each AllGather (two per step, one with SHARD_GRAD_OP, whose
    gathered parameters stay until the end of backward), its fp32 shard of the gradients
    device-to-host once (the root unit's single AllGather is neglected)."""
    one_of("strategy", strategy, OFFLOADABLE)
    n = job.gpus_per_node if strategy == "HYBRID_SHARD" else job.world_size
    gathers = 1 if strategy == "SHARD_GRAD_OP" else 2
    return OFFLOAD_COPY_BYTES * job.num_params / n * (gathers + 1)


def price(job: Job, strategy: str, checkpointing: bool = False, offload: bool = False) -> Option:
    """Memory per GPU and traffic per step of one rung for ``job``."""
    one_of("strategy", strategy, CANDIDATES)
    if strategy == "HYBRID_SHARD" and job.nodes < 2:
        raise ValueError("HYBRID_SHARD cần ít nhất 2 node (nodes >= 2).")
    if not isinstance(checkpointing, bool):
        raise ValueError(f"checkpointing phải là True hoặc False, nhận được {checkpointing!r}.")
    if checkpointing and not job.num_blocks:
        raise ValueError("checkpointing=True cần biết số khối: đặt largest_unit_params > 0 (số "
                         "tham số của một tầng).")
    if not isinstance(offload, bool):
        raise ValueError(f"offload phải là True hoặc False, nhận được {offload!r}.")
    if offload and strategy not in OFFLOADABLE:
        raise ValueError(f"offload=True chỉ dùng được với các bậc FSDP {OFFLOADABLE} "
                         f"(CPUOffloadPolicy); PyTorch không có CPU offload cho {strategy}.")
    hybrid = {"shard_size": job.gpus_per_node} if strategy == "HYBRID_SHARD" else {}
    if strategy == "ZeRO-1":  # as PyTorch runs it, not the paper's stage 1 (see the module)
        ledger = memory.zero_redundancy_ledger(
            job.num_params, job.world_size, optimizer=job.optimizer,
            activation_bytes=job.activation_bytes(checkpointing), bucket_view=True)
    else:
        ledger = memory.vram_ledger(job.num_params, job.world_size, strategy,
                                    precision=job.precision, optimizer=job.optimizer,
                                    phase="step", largest_unit_params=job.largest_unit_params,
                                    root_unit_params=job.root_unit_params,
                                    activation_bytes=job.activation_bytes(checkpointing),
                                    offload=offload, bucket_view=True, **hybrid)
    if strategy in ("DDP", "ZeRO-1") and not job.bucket_view:  # the fp32 copy, as under autocast
        ledger = replace(ledger, buffers=bucket_copy_bytes(job))
    volume = step_volume(job, strategy)
    internode = costs.internode_bytes(volume, strategy, job.nodes, job.gpus_per_node)
    host = ledger.host * job.gpus_per_node
    fits = ledger.total <= job.capacity_bytes and host <= job.host_capacity_bytes
    return Option(strategy, ledger.total, volume.total, internode, fits, checkpointing,
                  offload, host, pcie_bytes(job, strategy) if offload else 0.0)


def recommend(job: Job) -> Recommendation:
    """Price every rung of ``ladder(job)``; choose the lowest that fits, with a reason in
    Vietnamese and the numbers."""
    opts = {c: price(job, c) for c in CANDIDATES if c != "HYBRID_SHARD" or job.nodes > 1}
    rungs = tuple(opts[s] if not (ckpt or off) else price(job, s, ckpt, off)
                  for s, ckpt, off in ladder(job))
    chosen = next((o for o in rungs if o.fits), None)
    return Recommendation(job, chosen.strategy if chosen else None, _reason(job, rungs, chosen),
                          opts, rungs, chosen)


def _reason(job: Job, rungs: tuple[Option, ...], chosen: Option | None) -> str:
    """Which rungs did not fit, by how much, and what the chosen one costs."""
    cap = gb_text(job.capacity_bytes)
    if chosen is rungs[0]:
        return (f"DDP cần {gb_text(chosen.memory_bytes)} GB mỗi GPU, vừa {cap} GB dùng được: "
                "chọn DDP (mã đơn giản nhất, giao tiếp ít nhất).")
    failed = rungs[:rungs.index(chosen)] if chosen else rungs
    parts, tier = [], (False, False)
    for o in failed:
        head = _tier_text(job, (o.checkpointing, o.offload)) \
            if (o.checkpointing, o.offload) != tier else ""
        tier = (o.checkpointing, o.offload)
        parts.append(head + _shortfall(job, o))
    text = f"Mỗi GPU dùng được {cap} GB. Không vừa: " + "; ".join(parts) + ". "
    return text + (_chosen_text(job, chosen) if chosen else _nothing_text(job))


def _tier_text(job: Job, tier: tuple[bool, bool]) -> str:
    if tier == (True, False):
        return (f"với activation checkpointing (activation {gb_text(job.activation_bytes())} → "
                f"{gb_text(job.activation_bytes(True))} GB mỗi GPU): ")
    return "với CPU offload (trạng thái đã chia ra bộ nhớ CPU): " if tier == (False, True) \
        else "với cả hai: "


def _shortfall(job: Job, o: Option) -> str:
    text = f"{o.strategy} cần {gb_text(o.memory_bytes)} GB"
    if o.memory_bytes > job.capacity_bytes:
        text += f" (thiếu {gb_text(o.memory_bytes - job.capacity_bytes)} GB)"
    if o.host_bytes > job.host_capacity_bytes:
        text += (f", bộ nhớ CPU mỗi node {gb_text(o.host_bytes)} GB > "
                 f"{gb_text(job.host_capacity_bytes)} GB")
    return text


def _chosen_text(job: Job, o: Option) -> str:
    where = f"chia trong một node ({job.gpus_per_node} GPU)" if o.strategy == "HYBRID_SHARD" \
        else f"trên {job.world_size} GPU"
    text = (f"{o.strategy} {where} còn {gb_text(o.memory_bytes)} GB (dư "
            f"{gb_text(job.capacity_bytes - o.memory_bytes)} GB): chọn {o.label}")
    if o.strategy == "HYBRID_SHARD":
        text += " (HSDP), giữa các node chỉ còn AllReduce trên các shard gradient"
    elif o.strategy == "FULL_SHARD" and job.nodes > 1:
        text += " trên mọi node"
    if o.checkpointing:
        text += f"; mỗi bước tính lại lượt truyền xuôi của {job.num_blocks} khối"
    if o.offload:
        text += (f"; mỗi node giữ {gb_text(o.host_bytes)} GB trạng thái trong bộ nhớ CPU, mỗi GPU "
                 f"chép {gb_text(o.pcie_bytes)} GB qua PCIe mỗi bước, bước cập nhật chạy trên CPU")
    return text + "."


def _nothing_text(job: Job) -> str:
    skipped = []
    if not job.allow_checkpointing:
        skipped.append("activation checkpointing (không được phép)")
    elif not job.num_blocks:
        skipped.append("activation checkpointing (cần largest_unit_params để biết số khối)")
    if not job.allow_offload:
        skipped.append("CPU offload (không được phép)")
    tried = f"; chưa thử {', '.join(skipped)}" if skipped else ""
    return f"Không bậc nào vừa{tried}: cần thêm GPU, hoặc song song mô hình (các chương sau)."
