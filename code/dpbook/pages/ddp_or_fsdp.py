"""Choosing between DDP and FSDP: the decision rule of section 4.1.8, with the numbers behind it.

A ``Job`` describes a training run (model size, GPUs, precision, optimizer, an activation
allowance). ``recommend(job)`` prices three candidates with the package's own formulas,
``memory.vram_ledger`` for bytes per GPU and ``costs`` for bytes per step, and applies the rule:

1. DDP if the whole training state (plus activations) fits one GPU;
2. otherwise, on several nodes, ``HYBRID_SHARD`` with one node as the shard group, if that fits;
3. otherwise ``FULL_SHARD`` over every GPU, if that fits;
4. otherwise nothing here fits (more GPUs, activation checkpointing, offload, model parallelism).

Memory is taken at ``phase="step"``: FSDP then also holds the full parameters of the unit it is
computing (``largest_unit_params``). A ``headroom`` fraction of each GPU is kept free for the
CUDA context, allocator fragmentation and communication buffers.

Inter-node traffic is counted per node under the ring model: a ring over all ranks, ordered by
node, crosses each node boundary once, and that link carries what one rank sends. HYBRID_SHARD
runs one ring AllReduce per position in the node (``shard_size`` of them), each over the nodes.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, replace

from .. import costs, memory, vi
from ..checks import int_at_least, non_negative, one_of
from ..style import GB

CANDIDATES = ("DDP", "FULL_SHARD", "HYBRID_SHARD")


@dataclass(frozen=True)
class Job:
    """A training job: ``num_params`` on ``nodes`` x ``gpus_per_node`` GPUs of ``gpu_memory_gb``."""

    num_params: int
    gpu_memory_gb: float
    gpus_per_node: int = 8
    nodes: int = 1
    precision: str = "mixed"
    optimizer: str = "adam"
    activation_gb: float = 0.0  # activations and temporaries per GPU, an allowance the caller picks
    largest_unit_params: int = 0  # the biggest FSDP unit (one Transformer layer, the embedding)
    headroom: float = 0.1  # fraction of each GPU kept free
    name: str = ""

    def __post_init__(self):
        int_at_least("num_params", self.num_params)
        int_at_least("gpus_per_node", self.gpus_per_node)
        int_at_least("nodes", self.nodes)
        one_of("precision", self.precision, memory.PRECISIONS)
        one_of("optimizer", self.optimizer, memory.OPTIMIZERS)
        non_negative("activation_gb", self.activation_gb)
        non_negative("gpu_memory_gb", self.gpu_memory_gb)
        if self.gpu_memory_gb == 0:
            raise ValueError("gpu_memory_gb phải dương (dung lượng một GPU, tính bằng GB), nhận được 0.")
        if not 0 <= self.largest_unit_params <= self.num_params:
            raise ValueError(f"largest_unit_params phải nằm trong [0, num_params], nhận được "
                             f"{self.largest_unit_params!r}.")
        if isinstance(self.headroom, bool) or not isinstance(self.headroom, (int, float)) \
                or not 0 <= self.headroom < 1:
            raise ValueError(f"headroom là phần VRAM để trống, phải nằm trong [0, 1), nhận được "
                             f"{self.headroom!r}.")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def capacity_bytes(self) -> float:
        """What one GPU may hold for training state and activations."""
        return self.gpu_memory_gb * GB * (1 - self.headroom)

    @property
    def comm_bytes(self) -> int:
        """Bytes of ``Psi``: parameters as communicated (bf16 in mixed precision, fp32 otherwise)."""
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


def _gb(nbytes: float, digits: int = 1) -> str:
    """Gigabytes written the Vietnamese way: decimal comma, space between thousands."""
    return vi.number(nbytes / GB, digits, group=" ")


def price(job: Job, strategy: str) -> Option:
    """Memory per GPU and traffic per step of ``strategy`` for ``job``."""
    one_of("strategy", strategy, CANDIDATES)
    if strategy == "HYBRID_SHARD" and job.nodes < 2:
        raise ValueError("HYBRID_SHARD cần ít nhất 2 node (nodes >= 2).")
    n, s, psi = job.world_size, job.gpus_per_node, job.comm_bytes
    hybrid = {"shard_size": s} if strategy == "HYBRID_SHARD" else {}
    ledger = memory.vram_ledger(job.num_params, n, strategy, precision=job.precision,
                                optimizer=job.optimizer, phase="step",
                                largest_unit_params=job.largest_unit_params,
                                activation_bytes=job.activation_gb * GB, **hybrid)
    volume = costs.fsdp_step_bytes(psi, n, "DDP" if strategy == "DDP" else strategy, **hybrid)
    internode = costs.internode_bytes(volume, strategy, job.nodes, s)
    return Option(strategy, ledger.total, volume.total, internode,
                  ledger.total <= job.capacity_bytes)


def recommend(job: Job) -> Recommendation:
    """Apply the decision rule; the reason is one Vietnamese sentence with the numbers."""
    opts = {c: price(job, c) for c in CANDIDATES if c != "HYBRID_SHARD" or job.nodes > 1}
    cap, n, s = _gb(job.capacity_bytes), job.world_size, job.gpus_per_node
    ddp, full = opts["DDP"], opts["FULL_SHARD"]
    need = f"DDP cần {_gb(ddp.memory_bytes)} GB mỗi GPU > {cap} GB dùng được"
    if ddp.fits:
        return Recommendation(job, "DDP", (
            f"DDP cần {_gb(ddp.memory_bytes)} GB mỗi GPU, vừa {cap} GB dùng được: "
            "chọn DDP (mã đơn giản nhất, giao tiếp ít nhất)."), opts)
    hyb = opts.get("HYBRID_SHARD")
    if hyb is not None and hyb.fits:
        return Recommendation(job, "HYBRID_SHARD", (
            f"{need}; chia trong một node ({s} GPU) còn {_gb(hyb.memory_bytes)} GB: chọn "
            "FSDP HYBRID_SHARD, giữa các node chỉ AllReduce shard gradient."), opts)
    if full.fits:
        where = "" if hyb is None else f"; chia trong một node vẫn cần {_gb(hyb.memory_bytes)} GB"
        return Recommendation(job, "FULL_SHARD", (
            f"{need}{where}; FULL_SHARD trên {n} GPU còn {_gb(full.memory_bytes)} GB: "
            "chọn FSDP FULL_SHARD."), opts)
    return Recommendation(job, None, (
        f"Ngay cả FULL_SHARD trên {n} GPU cũng cần {_gb(full.memory_bytes)} GB > {cap} GB: cần"
        " thêm GPU hoặc kỹ thuật khác (tính lại activation, offload, song song mô hình)."), opts)


def resnet50_num_params(num_classes: int = 1000) -> int:
    """ResNet-50 (torchvision's layout) counted layer by layer: a 7x7 stem, bottleneck stages of
    3, 4, 6, 3 blocks (1x1, 3x3, 1x1 convolutions without bias, each followed by a BatchNorm
    with a weight and a bias per channel; a 1x1 projection in each stage's first block), and
    a fully connected head."""
    int_at_least("num_classes", num_classes)

    def conv_bn(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k + 2 * cout

    total, cin = conv_bn(3, 64, 7), 64
    for width, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3)):
        for b in range(blocks):
            total += conv_bn(cin, width, 1) + conv_bn(width, width, 3) + conv_bn(width, 4 * width, 1)
            total += conv_bn(cin, 4 * width, 1) if b == 0 else 0  # the projection shortcut
            cin = 4 * width
    return total + cin * num_classes + num_classes


# --- a real run: what changes between DDP and FSDP, in bytes and in the code around the model

def wrap_facts(par) -> dict:
    """What wrapping with ``par`` means for the surrounding code: does the wrapped model still
    expose the original parameter objects (an optimizer built before wrapping would be
    silently wrong otherwise), and what does ``state_dict()`` hold."""
    from ..models import build_mlp
    from ..train import apply_parallel

    model = build_mlp()
    before = list(model.parameters())
    wrapped = apply_parallel(model, par)
    after = list(wrapped.parameters())
    key, value = next(iter(wrapped.state_dict().items()))
    return {"same_parameters": len(before) == len(after) and all(
                a is b for a, b in zip(before, after)),
            "first_key": key, "value_type": type(value).__name__}


def compare_run(rank: int, world_size: int, parallels=None) -> dict:
    """Rank function for ``launch.spawn``: ``measure.measure_step`` and ``wrap_facts`` for DDP
    and FSDP2 (``reshard_after_forward=True``, i.e. FULL_SHARD), keyed by label."""
    from ..measure import measure_step
    from ..train import Parallel

    parallels = parallels or (Parallel("ddp"), Parallel("fsdp2", reshard_after_forward=True))
    return {p.label: {**measure_step(rank, world_size, p), "code": wrap_facts(p)}
            for p in parallels}


# --- what the page shows: tables (HTML, so they render in the static book) and a figure

_LABELS = {"DDP": "DDP", "FULL_SHARD": "FSDP FULL_SHARD", "HYBRID_SHARD": "FSDP HYBRID_SHARD"}
_FORMULAS = {
    "memory": {"DDP": "{k}P", "FULL_SHARD": "{k}P/N + một đơn vị đầy đủ",
               "HYBRID_SHARD": "{k}P/S + một đơn vị đầy đủ"},  # k: state bytes per parameter
    "sent": {"DDP": "2(N−1)/N · Ψ", "FULL_SHARD": "3(N−1)/N · Ψ",
             "HYBRID_SHARD": "3(S−1)/S · Ψ + 2(R−1)/R · Ψ/S"},
    "code": {"DDP": "thấp: bọc DDP(model), DistributedSampler, rank 0 lưu state_dict",
             "FULL_SHARD": "cao hơn: fully_shard từng khối rồi gốc, tạo optimizer sau khi bọc, "
                           "MixedPrecisionPolicy, lưu bằng DCP trên mọi rank",
             "HYBRID_SHARD": "như FULL_SHARD, thêm DeviceMesh hai chiều (node × GPU)"},
    "scale": {"DDP": "mô hình vừa một GPU, một hay nhiều node",
              "FULL_SHARD": "không vừa một GPU; một node, hoặc chia trong một node vẫn không vừa",
              "HYBRID_SHARD": "nhiều node, mô hình vừa khi chia trong một node"},
}


def _table(header: list[str], rows: list[list[str]]) -> str:
    def cells(tag: str, row: list[str]) -> str:
        return "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in row)

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f'<table class="dpbook-table"><thead><tr>{cells("th", header)}</tr></thead>' \
           f"<tbody>{body}</tbody></table>"


def criteria_html(rec: Recommendation) -> str:
    """The comparison table of the four criteria, formulas and this job's numbers."""
    def gb(nbytes: float) -> str:
        return f"{_gb(nbytes, 2)} GB"

    names = list(rec.options)
    k = sum(memory.bytes_per_param(rec.job.precision, rec.job.optimizer))
    rows = [["Bộ nhớ mỗi GPU (trạng thái + activation)"]
            + [f"{_FORMULAS['memory'][c].format(k=k)} + activation: "
               f"{gb(rec.options[c].memory_bytes)}" for c in names],
            ["Lượng gửi mỗi GPU mỗi bước"]
            + [f"{_FORMULAS['sent'][c]}: {gb(rec.options[c].sent_bytes)}" for c in names]]
    if rec.job.nodes > 1:
        rows.append(["Lượng ra khỏi mỗi node mỗi bước"]
                    + [gb(rec.options[c].internode_bytes) for c in names])
    rows += [["Độ phức tạp mã nguồn"] + [_FORMULAS["code"][c] for c in names],
             ["Quy mô phù hợp"] + [_FORMULAS["scale"][c] for c in names]]
    return _table(["Tiêu chí"] + [_LABELS[c] for c in names], rows)


def decision_html(recs: list[Recommendation]) -> str:
    """One row per job: GPUs, memory per GPU under each candidate, the choice."""
    def mem(r, c):
        o = r.options.get(c)
        return "—" if o is None else _gb(o.memory_bytes) + ("" if o.fits else " ✗")

    rows = [[r.job.name, f"{r.job.nodes} × {r.job.gpus_per_node} × {r.job.gpu_memory_gb:g} GB",
             _gb(r.job.capacity_bytes)] + [mem(r, c) for c in CANDIDATES]
            + [_LABELS.get(r.choice, "không phương án nào vừa")] for r in recs]
    return _table(["Trường hợp", "node × GPU × VRAM", "dùng được (GB)", "DDP (GB)",
                   "FULL_SHARD (GB)", "HYBRID_SHARD (GB)", "Lựa chọn"], rows)


def memory_figure(job: Job, world_sizes=(1, 2, 4, 8, 16, 32, 64)):
    """Bytes per GPU against the number of GPUs for DDP and FULL_SHARD, with the GPU's capacity."""
    import matplotlib.pyplot as plt

    from ..style import PALETTE

    ys = {c: [price(replace(job, gpus_per_node=n, nodes=1), c).memory_bytes / GB
              for n in world_sizes] for c in ("DDP", "FULL_SHARD")}
    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    ax.plot(world_sizes, ys["DDP"], "o-", color=PALETTE["vermillion"], label="DDP")
    ax.plot(world_sizes, ys["FULL_SHARD"], "s-", color=PALETTE["blue"], label="FSDP FULL_SHARD")
    ax.axhline(job.gpu_memory_gb, color=PALETTE["black"], lw=1.5,
               label=f"VRAM một GPU: {job.gpu_memory_gb:g} GB")
    ax.axhline(job.capacity_bytes / GB, color=PALETTE["grey"], ls="--",
               label=f"dùng được (để trống {job.headroom:.0%})")
    if job.activation_gb:
        ax.axhline(job.activation_gb, color=PALETTE["green"], ls=":",
                   label=f"activation: {job.activation_gb:g} GB (không chia mảnh)")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(world_sizes, [str(n) for n in world_sizes])
    ax.set_xlabel("số GPU N")
    ax.set_ylabel("bộ nhớ mỗi GPU (GB)")
    ax.set_title(f"{job.name}: bộ nhớ mỗi GPU (trạng thái, đơn vị gom về, activation)", loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: the curves fill the axes
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig, ys
