"""Labs B and C of section 4.2: several wrappings of one model, measured in one launch and set
against the VRAM ledger and the communication formulas.

* ``measure_configs``: rank function for ``launch.spawn``; runs ``measure.measure_step`` for each
  ``train.Parallel`` in turn, in the same processes (a 4-rank start costs seconds on a CPU, so
  one launch serves every configuration of a world size). The model size follows the device
  (``workload``): small on CPU, larger on GPU, same code path.
* ``collect``: the per-rank results turned into one ``Row`` per configuration: state bytes, peak
  memory (largest over ranks), bytes per step per collective and per process group, median step
  time (slowest rank) and throughput = global batch / step time, next to ``predict``.
* ``held_in_step``: rank function; the parameter bytes a rank holds at two moments of a step
  (``MOMENTS``), and whether the root unit is unsharded then: what the in-step ledger predicts.
* ``predict``: what ``memory.vram_ledger`` and ``costs`` say for the same configuration.
* ``table``, ``comm_table``, ``step_table``, ``figure_memory_throughput``,
  ``figure_strategies``: the pages' tables and figures, with Vietnamese labels.
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass

from .. import vi
from ..checks import int_at_least, one_of
from ..costs import StepVolume, ddp_step_bytes, fsdp_step_bytes
from ..measure import bytes_by_group
from ..memory import Ledger, vram_ledger
from ..style import EDGE, MB, series_colour
from ..train import Parallel

DEVICE_TYPES = ("cpu", "cuda")
LAB_B = (Parallel("ddp"), Parallel("fsdp1", strategy="FULL_SHARD"), Parallel("fsdp2"))
LAB_C = (Parallel("fsdp1", strategy="FULL_SHARD"), Parallel("fsdp1", strategy="SHARD_GRAD_OP"),
         Parallel("fsdp1", strategy="NO_SHARD"),
         Parallel("fsdp1", strategy="HYBRID_SHARD", shard_size=2))
# Short names for tables and figures, in the order of the labs.
SHORT = {"DDP": "DDP", "FSDP1 FULL_SHARD": "FULL_SHARD", "FSDP1 SHARD_GRAD_OP": "SHARD_GRAD_OP",
         "FSDP1 NO_SHARD": "NO_SHARD", "FSDP1 HYBRID_SHARD": "HYBRID_SHARD (2)",
         "FSDP2 reshard_after_forward=None": "FSDP2"}


@dataclass(frozen=True)
class Workload:
    """The model (``models.build_mlp`` arguments) and the per-rank batch of a lab run.

    Every dimension divides by 8, so FSDP shards split evenly on up to 8 ranks (no padding):
    the measured bytes can then equal the formulas exactly.
    """

    model_kwargs: dict
    batch_size: int
    repeats: int  # timed steps per configuration (the median is kept)


WORKLOADS = {
    # CPU: about 0.2 M parameters, a few MB of state: a step takes milliseconds even on 2 cores.
    "cpu": Workload({"in_dim": 64, "hidden": 256, "depth": 4, "out_dim": 8}, 32, 3),
    # GPU: about 31.5 M parameters, 0.5 GB of fp32 Adam state per DDP rank: enough for CUDA's
    # peak memory to be dominated by the training state, small enough for any GPU.
    "cuda": Workload({"in_dim": 1024, "hidden": 2048, "depth": 8, "out_dim": 8}, 256, 10),
}


def workload(device_type: str) -> Workload:
    """The workload for ``device_type`` ("cpu" or "cuda")."""
    one_of("device_type", device_type, DEVICE_TYPES)
    return WORKLOADS[device_type]


def lab_backend(max_world_size: int) -> str:
    """``"auto"`` if the machine has a GPU for each of ``max_world_size`` ranks, else ``"gloo"``:
    every world size of a lab then runs on the same device with the same model, so their
    numbers can be compared (``spawn``'s automatic choice could put N=2 on GPUs and N=4 on CPU)."""
    from ..launch import plan

    return "auto" if plan(max_world_size).backend == "nccl" else "gloo"


def measure_configs(rank: int, world_size: int, parallels=LAB_B,
                    wl: Workload | None = None) -> dict:
    """Rank function: ``measure_step`` for each of ``parallels`` on this rank's device, keyed by
    label, plus the ``"workload"`` used (by default the one for ``launch.device()``)."""
    import torch

    from ..launch import device
    from ..measure import measure_step

    dev = device()
    wl = wl or workload(dev.type)
    out = {"workload": wl}
    for par in parallels:
        out[par.label] = measure_step(rank, world_size, par, model_kwargs=wl.model_kwargs,
                                      batch_size=wl.batch_size, warmup=2, repeats=wl.repeats)
        gc.collect()  # FSDP holds reference cycles: free this model before the next one
        out[par.label]["in_step"] = held_in_step(rank, world_size, par, wl)
        gc.collect()
        if dev.type == "cuda":  # on a CPU rank, asking CUDA would open a context on GPU 0
            torch.cuda.empty_cache()
    return out


@dataclass(frozen=True)
class Held:
    """Parameter bytes one rank holds at one moment of a step: its shards plus every full copy
    that FSDP has gathered and not yet freed (``params``), and of those the root unit's full
    copy (``root``; 0 while the root is sharded)."""

    params: int
    root: int


# When ``held_in_step`` looks: the forward of the last block, the backward of the first block.
MOMENTS = ("lượt xuôi, khối cuối", "lượt ngược, khối đầu")


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def held_params(model, par: Parallel) -> Held:
    """``Held`` for an FSDP-wrapped ``model`` now. FSDP keeps each rank's shard and gathers a
    unit into a buffer of its own, freed on resharding (storage size 0): FSDP1's
    ``FlatParameter._full_param_padded`` (``FlatParamHandle._free_unsharded_flat_param`` in
    ``torch/distributed/fsdp/_flat_param.py``), FSDP2's ``FSDPParam.all_gather_outputs``
    (``FSDPParam.free_unsharded_param`` in ``_fully_shard/_fsdp_param.py``), and, while a
    prefetched AllGather waits to be copied out, its flat output
    (``FSDPParamGroup._all_gather_result``, freed in ``wait_for_unshard``)."""
    one_of("par.method", par.method, ("fsdp1", "fsdp2"))
    total = root = 0
    if par.method == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for unit in FSDP.fsdp_modules(model):
            if unit._handle is None:
                continue
            flat = unit._handle.flat_param
            shard = _nbytes(flat._local_shard)
            full = (flat._full_param_padded.untyped_storage().nbytes()
                    if unit._handle.uses_sharded_strategy else shard)  # NO_SHARD: shard = full
            total += full + (shard if unit._handle.uses_sharded_strategy else 0)
            root += full if unit is model else 0
        return Held(total, root)
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in module._get_fsdp_state()._fsdp_param_groups:
            pending = group._all_gather_result  # prefetched, not yet copied out
            full = pending.all_gather_output.untyped_storage().nbytes() if pending else 0
            for p in group.fsdp_params:
                full += sum(t.untyped_storage().nbytes() for t in p.all_gather_outputs)
                total += _nbytes(p.sharded_param.to_local())
            total += full
            root += full if module is model else 0
    return Held(total, root)


def held_in_step(rank: int, world_size: int, par: Parallel, wl: Workload) -> dict:
    """Rank function (called by ``measure_configs``): wrap the lab's MLP as ``par`` says, take
    one step, then look during a second one, at each of ``MOMENTS``, at ``held_params``.
    ``{}`` for DDP, which gathers nothing."""
    import torch

    from ..data import rank_batch, synthetic_regression
    from ..models import build_mlp
    from ..train import apply_parallel, train_step

    if par.method == "ddp":
        return {}
    model = build_mlp(**wl.model_kwargs)
    blocks = list(model.blocks)  # FSDP1 wraps them in place; the hooks stay on the originals
    wrapped = apply_parallel(model, par)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    ds = synthetic_regression(wl.batch_size * world_size, blocks[0].linear.in_features,
                              model.head.out_features)
    x, y = rank_batch(ds.tensors, rank, wl.batch_size, next(wrapped.parameters()).device)
    train_step(wrapped, optimizer, x, y)
    seen = {}

    def look(moment):
        seen[moment] = held_params(wrapped, par)

    hooks = (blocks[-1].register_forward_pre_hook(lambda *_: look(MOMENTS[0])),
             blocks[0].register_full_backward_pre_hook(lambda *_: look(MOMENTS[1])))
    try:
        train_step(wrapped, optimizer, x, y)
    finally:
        for h in hooks:
            h.remove()
    return seen


@dataclass(frozen=True)
class ModelNumbers:
    """Parameter counts of the MLP that the formulas need."""

    num_params: int
    root_params: int  # owned by no ``Block``: the root unit (the head)
    largest_unit: int  # the largest ``Block``: what FSDP gathers at once


def model_numbers(model_kwargs: dict) -> ModelNumbers:
    """Count on the ``meta`` device, so that a large model costs no memory."""
    import torch

    from ..models import build_mlp, num_params

    with torch.device("meta"):
        model = build_mlp(**model_kwargs)
    units = [num_params(b) for b in model.blocks]
    total = num_params(model)
    return ModelNumbers(total, total - sum(units), max(units))


@dataclass(frozen=True)
class Prediction:
    """What the formulas say for one configuration (fp32, Adam): the ledger between steps
    (``rest``), during a step (``step``), and the bytes one rank sends per step."""

    strategy: str
    rest: Ledger
    step: Ledger
    volume: StepVolume


def predict(par: Parallel, num_params: int, world_size: int, root_params: int = 0,
            largest_unit: int = 0) -> Prediction:
    """``memory.vram_ledger`` and ``costs`` for ``par`` on ``world_size`` ranks, fp32 + Adam.

    ``root_params``: parameters of the root unit (what no block owns). The root's pre-forward
    gathers it before the first block, so it is unsharded while every block computes, in every
    FSDP configuration of the labs: FSDP1 (``_post_forward_reshard`` in
    ``torch/distributed/fsdp/_runtime_utils.py`` does not free the root) and FSDP2's default
    (``FSDPState._lazy_init`` sets the root's ``post_forward_mesh_info = None``) keep it until
    the end of backward, with no backward AllGather for it; FSDP2 with
    ``reshard_after_forward=True`` frees it after forward and gathers it again for backward.
    The in-step ledger therefore counts it (``root_unit_params``), next to the
    ``largest_unit``, the largest block, gathered in full while it computes; SHARD_GRAD_OP
    (and FSDP2 with ``False``) already holds every parameter in full. ``held_in_step``
    measures both.
    """
    int_at_least("num_params", num_params)
    int_at_least("world_size", world_size)
    strategy = par.ledger_strategy
    kw = {"shard_size": par.shard_size} if strategy == "HYBRID_SHARD" else {}
    rest = vram_ledger(num_params, world_size, strategy, **kw)
    step = vram_ledger(num_params, world_size, strategy, phase="step",
                       largest_unit_params=largest_unit, root_unit_params=root_params, **kw)
    psi = 4 * num_params  # fp32
    if strategy == "DDP":
        volume = ddp_step_bytes(psi, world_size)
    else:
        keeps_root = par.method == "fsdp1" or par.reshard_after_forward is None
        volume = fsdp_step_bytes(psi, world_size, strategy, shard_size=par.shard_size,
                                 root_bytes=4 * root_params if keeps_root else 0.0)
    return Prediction(strategy, rest, step, volume)


@dataclass(frozen=True)
class Row:
    """One configuration on ``world_size`` ranks: rank 0's bytes, the worst rank's peak and
    time, and the prediction."""

    label: str
    world_size: int
    global_batch: int
    num_params: int
    state: Ledger  # measured on rank 0 (allocations), right after optimizer.step(); DDP's
    # bucket copy of the gradients in ``buffers``
    peak: int  # largest peak over ranks
    peak_method: str  # "cuda" or "memtracker"
    peak_breakdown: dict  # rank 0's peak by kind (MemTracker only)
    volume: StepVolume  # the ring formula's bytes rank 0 sends for the step's collectives
    by_group: dict  # {group ranks: {collective: ring formula's bytes rank 0 sends}}
    calls: int  # collectives rank 0 issued in the step
    step_time: float  # seconds: the slowest rank's median
    predicted: Prediction
    in_step: dict  # rank 0's ``Held`` at each of ``MOMENTS`` ({} for DDP)
    wire: object = None  # ``measure.WireCount`` of rank 0's sockets in the step; None off gloo

    @property
    def short(self) -> str:
        return SHORT.get(self.label, self.label)

    @property
    def throughput(self) -> float:
        """Samples per second: the global batch over the median step time."""
        return self.global_batch / self.step_time


def by_group(records) -> dict:
    """The ring formula's bytes sent per process group (its global ranks) and per collective."""
    return bytes_by_group((r.group_ranks, r.collective, r.ring_share_bytes) for r in records)


def collect(results: list, parallels) -> list[Row]:
    """``spawn(measure_configs, ...)``'s per-rank results as one ``Row`` per configuration."""
    world_size = len(results)
    wl = results[0]["workload"]
    unit = model_numbers(wl.model_kwargs).largest_unit
    rows = []
    for par in parallels:
        if par.label not in results[0]:
            raise ValueError(f"Không có kết quả đo cho {par.label!r}; có: "
                             f"{[k for k in results[0] if k != 'workload']}.")
        per_rank = [r[par.label] for r in results]
        r0 = per_rank[0]
        st = r0["state"]
        worst = max(per_rank, key=lambda r: r["peak"].peak)
        rows.append(Row(
            par.label, world_size, wl.batch_size * world_size, r0["num_params"],
            st.as_ledger(), worst["peak"].peak,
            worst["peak"].method, dict(worst["peak"].breakdown), r0["volume"],
            by_group(r0["records"]), len(r0["records"]),
            max(statistics.median(r["step_times"]) for r in per_rank),
            predict(par, r0["num_params"], world_size, r0["root_params"], unit),
            dict(r0["in_step"]), r0.get("wire")))
    return rows


PEAK_KINDS = (("PARAM", "tham số"), ("GRAD", "gradient"), ("OPT", "bộ tối ưu"),
              ("ACT", "activation"), ("TEMP", "tạm"))


def peak_parts(row: Row) -> dict[str, int]:
    """The peak by kind, with Vietnamese names: MemTracker's categories on CPU; on CUDA, which
    has only a total, the measured state and the rest."""
    if row.peak_method != "memtracker":
        state = int(row.state.state)
        return {"trạng thái": state, "phần còn lại": row.peak - state}
    return {name: row.peak_breakdown.get(f"_MemRefType.{k}", 0) for k, name in PEAK_KINDS}


def table(rows: list[Row]) -> str:
    """Memory and speed, one line per row: what a rank holds between steps by the ledger and as
    measured (state and DDP's bucket copy, ``Ledger.total``), peak (MB), step time (ms) and
    throughput (samples/s)."""
    head = (f"{'N':>2}  {'cách chạy':<18}{'sổ kế toán':>11}{'đo lúc nghỉ':>14}"
            f"{'đỉnh đo':>9}{'bước (ms)':>10}{'mẫu/s':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.world_size:>2}  {r.short:<18}"
                     f"{vi.number(r.predicted.rest.total / MB, 3):>11}"
                     f"{vi.number(r.state.total / MB, 3):>14}{vi.number(r.peak / MB, 3):>9}"
                     f"{vi.number(1e3 * r.step_time, 2):>10}{vi.grouped(r.throughput):>9}")
    lines.append("(bộ nhớ tính bằng MB = 10^6 byte, mỗi rank; lúc nghỉ: trạng thái cộng bộ đệm "
                 "bucket của DDP)")
    return "\n".join(lines)


def comm_table(rows: list[Row]) -> str:
    """Bytes rank 0 sends in one step by the ring formula, per collective and pass, beside the
    prediction from P and the bytes measured on rank 0's sockets (gloo; "—" elsewhere)."""
    cols = (("all_gather_forward", "AG xuôi"), ("all_gather_backward", "AG ngược"),
            ("reduce_scatter", "RS"), ("all_reduce", "AR"))
    head = f"{'cách chạy':<18}" + "".join(f"{t:>10}" for _, t in cols) + \
        f"{'tổng':>10}{'dự đoán':>11}{'đo trên socket':>16}"
    lines = [head, "-" * len(head)]
    for r in rows:
        vals = "".join(f"{vi.grouped(getattr(r.volume, f)):>10}" for f, _ in cols)
        wire = "—" if r.wire is None else vi.grouped(r.wire.sent)
        lines.append(f"{r.short:<18}{vals}{vi.grouped(r.volume.total):>10}"
                     f"{vi.grouped(r.predicted.volume.total):>11}{wire:>16}")
    lines.append("(byte rank 0 gửi trong một bước: công thức vòng áp lên các phép toán tập thể ghi "
                 "được, dự đoán từ P, và số đo trên socket của gloo)")
    return "\n".join(lines)


def step_table(rows: list[Row]) -> str:
    """Parameters during the step, one line per FSDP row: the in-step ledger's parameter bytes
    (MB), then at each of ``MOMENTS`` what rank 0 held (MB) and whether the root unit was
    unsharded ("đủ") or sharded ("chia")."""
    head = f"{'N':>2}  {'cách chạy':<18}{'sổ kế toán':>11}" + "".join(
        f"{m + ' (MB)':>28}{'gốc':>6}" for m in MOMENTS)
    lines = [head, "-" * len(head)]
    for r in rows:
        if not r.in_step:
            continue
        cells = "".join(f"{vi.number(r.in_step[m].params / MB, 3):>28}"
                        f"{'đủ' if r.in_step[m].root else 'chia':>6}" for m in MOMENTS)
        lines.append(f"{r.world_size:>2}  {r.short:<18}"
                     f"{vi.number(r.predicted.step.params / MB, 3):>11}{cells}")
    lines.append("(byte tham số rank 0 giữ: shard của mình và mọi bản đầy đủ đã gom; "
                 "MB = 10^6 byte)")
    return "\n".join(lines)


def _bars(ax, names, values, ylabel, title):
    bars = ax.bar(names, values, color=[series_colour(i) for i in range(len(names))],
                  edgecolor=EDGE)
    for b, v in zip(bars, values):
        ax.text(b.get_x() + b.get_width() / 2, v, vi.number(v, 2),
                ha="center", va="bottom", fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)
    ax.margins(y=0.12)


def figure_memory_throughput(rows: list[Row]):
    """Lab B: peak memory per rank (bars) with the ledger's state (black ticks), and throughput,
    grouped by world size. Returns the matplotlib ``Figure``."""
    import matplotlib.pyplot as plt

    sizes = sorted({r.world_size for r in rows})
    labels = list(dict.fromkeys(r.short for r in rows))
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(labels)
    for i, name in enumerate(labels):
        mine = {r.world_size: r for r in rows if r.short == name}
        xs = [k + (i - (len(labels) - 1) / 2) * width for k in range(len(sizes))]
        peaks = [mine[n].peak / MB for n in sizes]
        ax_m.bar(xs, peaks, width, color=series_colour(i), edgecolor=EDGE, label=name)
        ax_m.scatter(xs, [mine[n].predicted.rest.state / MB for n in sizes], marker="_",
                     s=600, color="black", zorder=3,
                     label="sổ kế toán (trạng thái)" if i == 0 else None)
        ax_t.bar(xs, [mine[n].throughput for n in sizes], width, color=series_colour(i),
                 edgecolor=EDGE, label=name)
    for ax, ylabel, title in ((ax_m, "MB mỗi rank", "Bộ nhớ đỉnh mỗi rank"),
                              (ax_t, "mẫu/giây", "Thông lượng huấn luyện")):
        ax.set_xticks(range(len(sizes)), [f"N = {n}" for n in sizes])
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.margins(y=0.12)
    ax_m.legend(fontsize=8, loc="upper center", bbox_to_anchor=(1.1, -0.1), ncol=4,
                frameon=False)
    fig.tight_layout()
    return fig


def figure_strategies(rows: list[Row]):
    """Lab C: peak memory (with the ledger's in-step state as black ticks), bytes sent per step
    (stacked by collective) and median step time, one bar per strategy."""
    import matplotlib.pyplot as plt

    names = [r.short for r in rows]
    fig, (ax_m, ax_c, ax_t) = plt.subplots(1, 3, figsize=(13, 4.2))
    _bars(ax_m, names, [r.peak / MB for r in rows], "MB mỗi rank", "Bộ nhớ đỉnh")
    ax_m.scatter(names, [r.predicted.step.state / MB for r in rows], marker="_", s=600,
                 color="black", zorder=3, label="sổ kế toán, trong bước")
    ax_m.legend(fontsize=8)
    parts = (("all_gather_forward", "AllGather xuôi"),
             ("all_gather_backward", "AllGather ngược"),
             ("reduce_scatter", "ReduceScatter"), ("all_reduce", "AllReduce"))
    base = [0.0] * len(rows)
    for i, (field, label) in enumerate(parts):
        vals = [getattr(r.volume, field) / MB for r in rows]
        ax_c.bar(names, vals, bottom=base, color=series_colour(i), edgecolor=EDGE, label=label)
        base = [b + v for b, v in zip(base, vals)]
    ax_c.set_ylabel("MB rank 0 gửi mỗi bước")
    ax_c.set_title("Giao tiếp mỗi bước")
    ax_c.tick_params(axis="x", labelrotation=20)
    ax_c.margins(y=0.12)
    ax_c.legend(fontsize=8)
    _bars(ax_t, names, [1e3 * r.step_time for r in rows], "ms",
          "Thời gian một bước (trung vị)")
    fig.tight_layout()
    return fig
