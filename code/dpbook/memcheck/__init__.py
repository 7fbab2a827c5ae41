"""``python -m dpbook.memcheck``: the VRAM ledger against the learner's own model, measured.

``run(spec, strategy, ...)`` trains ``FUNCTION()``'s model (``spec`` is ``MODULE:FUNCTION``; a
module is a dotted name or a ``.py`` file) for ``steps`` steps with Adam on ``nproc`` ranks
(``launch.spawn``: gloo on CPU, NCCL with one GPU per rank), wrapped as ``strategy`` says, and
returns a ``Report``: per rank, what the ledger predicts (``memory.vram_ledger``,
``memory.zero_redundancy_ledger``) beside what the rank allocated, by category, between steps
(right after ``optimizer.step()`` of the last step, the ledger's ``phase="rest"``), the
activations saved for backward at the end of the last forward, and the peak of the last step, predicted and measured; then the
diagnoses that name the cause of a gap (``DIAGNOSES``).

Measured means allocated: an ``allocations.Census`` runs in each rank from before
``FUNCTION()`` is called, so every storage the model, the wrapper and the optimizer allocate is
seen (DDP's buckets, FSDP's gathered units), and each byte is attributed to a category or to
``other``. On a GPU the peak is ``torch.cuda.max_memory_allocated()`` (what the census does not
see, the allocator's rounding and library workspaces, goes to ``other``).

The predicted peak is the ledger at ``phase="step"`` (FSDP: the largest unit and the root unit
gathered) plus the activations measured at the end of forward: the ledger takes activations as an input,
it does not guess them.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import os
import pathlib
import sys
from dataclasses import dataclass, field

from ..checks import int_at_least, one_of

STRATEGIES = {  # --strategy: what it runs, and its row of the ledger
    "ddp": "DistributedDataParallel (gradient_as_bucket_view=False, mặc định)",
    "ddp-view": "DistributedDataParallel(gradient_as_bucket_view=True)",
    "zero1": "DDP + ZeroRedundancyOptimizer(Adam)",
    "fsdp2": "fully_shard (FSDP2), mặc định reshard_after_forward",
    "fsdp2-noreshard": "fully_shard (FSDP2), reshard_after_forward=False",
}
CATEGORIES = ("parameters", "gradients", "optimizer", "buffers", "activations", "other")
NAMES = {"parameters": "tham số", "gradients": "gradient", "optimizer": "trạng thái bộ tối ưu",
         "buffers": "bộ đệm giao tiếp", "activations": "activation (cuối lượt xuôi)",
         "other": "khác"}
DIAGNOSES = ("single_unit", "bucket_copy", "no_reshard", "activations_dominate", "small_world",
             "buffers_dominate")
# --wrap auto: a submodule is a unit when it holds at most AUTO_MAX of the parameters and at
# least AUTO_MIN (smaller ones stay with the root), the first such module on each path down.
AUTO_MAX, AUTO_MIN = 1 / 4, 1 / 64
SINGLE_UNIT_SHARE = 0.5  # single_unit: one gathered unit holds at least half the parameters
LR = 1e-3


class MemcheckError(ValueError):
    """Bad input, said in Vietnamese: what was wrong and what is allowed."""


# --- FUNCTION(): the learner's model and batch -----------------------------------------------

def load(spec: str):
    """The callable ``MODULE:FUNCTION`` names (a module by dotted name or a ``.py`` path)."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise MemcheckError(f"cần MODULE:FUNCTION (ví dụ dpbook.memcheck.examples:book_mlp hoặc "
                            f"mo_hinh.py:tao), nhận được {spec!r}.")
    module_name, fn_name = spec.split(":")
    if module_name.endswith(".py"):
        path = pathlib.Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise MemcheckError(f"không có file {module_name!r}.")
        name = f"_memcheck_{path.stem}"
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) != str(path):
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[name] = module
            loader.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise MemcheckError(f"không import được module {module_name!r} ({e}).") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise MemcheckError(f"module {module_name!r} không có hàm {fn_name!r}.")
    return fn


def call(fn):
    """``fn()`` checked: ``(model, batch)`` or ``(model, batch, loss_fn)``, where the batch is a
    tensor or a tuple of tensors. Returns ``(model, batch tuple, loss_fn)``."""
    import torch

    out = fn()
    if not (isinstance(out, tuple) and len(out) in (2, 3)):
        raise MemcheckError(f"hàm phải trả về (model, batch) hoặc (model, batch, loss_fn), "
                            f"nhận được {type(out).__name__}.")
    model, batch = out[0], out[1]
    loss_fn = out[2] if len(out) == 3 else (lambda y: y.float().pow(2).mean())
    batch = (batch,) if isinstance(batch, torch.Tensor) else batch
    if not isinstance(model, torch.nn.Module):
        raise MemcheckError(f"phần tử đầu phải là một torch.nn.Module, nhận được "
                            f"{type(model).__name__}.")
    if not (isinstance(batch, tuple) and batch and all(isinstance(t, torch.Tensor) for t in batch)):
        raise MemcheckError("batch phải là một tensor hoặc một tuple các tensor.")
    if not callable(loss_fn):
        raise MemcheckError("phần tử thứ ba (loss_fn) phải gọi được: loss_fn(output) trả về giá "
                            "trị mất mát.")
    return model, batch, loss_fn


def units(model, wrap: str) -> list[str]:
    """Qualified names of the submodules that become FSDP units (the root is always one):
    ``"root"`` none, ``"auto"`` the size rule (``AUTO_MAX``, ``AUTO_MIN``), else the names
    matching the pattern (``fnmatch``), outermost first."""
    total = sum(p.numel() for p in model.parameters())
    if wrap == "root":
        return []
    chosen: list[str] = []

    def visit(prefix, module):
        for name, child in module.named_children():
            qual = f"{prefix}{name}"
            size = sum(p.numel() for p in child.parameters())
            if wrap == "auto":
                if size <= AUTO_MAX * total:
                    if size >= AUTO_MIN * total:
                        chosen.append(qual)
                    continue
            elif fnmatch.fnmatchcase(qual, wrap):
                chosen.append(qual)
                continue
            visit(qual + ".", child)

    visit("", model)
    if wrap != "auto" and not chosen:
        raise MemcheckError(f"--wrap {wrap!r} không khớp module con nào; tên có trong mô hình: "
                            f"{[n for n, _ in model.named_modules() if n][:12]}.")
    return chosen


@dataclass(frozen=True)
class Shape:
    """What the ledger needs about the model and its wrapping."""

    num_params: int
    largest_unit: int  # the largest non-root unit's parameters (0 without units)
    root_params: int  # what no unit owns: the root unit
    input_bytes: int  # the batch a rank gets


def shape(model, batch, strategy: str, wrap: str) -> Shape:
    names = units(model, wrap) if strategy.startswith("fsdp2") else []
    mods = dict(model.named_modules())
    sizes = [sum(p.numel() for p in mods[n].parameters()) for n in names]
    total = sum(p.numel() for p in model.parameters())
    return Shape(total, max(sizes, default=0), total - sum(sizes),
                 sum(t.numel() * t.element_size() for t in batch))


# --- the ledger's side ----------------------------------------------------------------------

def predict(strategy: str, s: Shape, world_size: int, activations: float = 0.0) -> dict:
    """``{"rest": {category: bytes or None}, "peak": bytes}``: the ledger between steps (fp32,
    Adam) and at ``phase="step"`` with the measured ``activations`` added."""
    from .. import memory

    one_of("strategy", strategy, STRATEGIES)
    kw = dict(largest_unit_params=s.largest_unit, root_unit_params=s.root_params)
    if strategy == "zero1":
        rest = step = memory.zero_redundancy_ledger(s.num_params, world_size)
    else:
        row = {"ddp": "DDP", "ddp-view": "DDP", "fsdp2": "FULL_SHARD",
               "fsdp2-noreshard": "SHARD_GRAD_OP"}[strategy]
        view = strategy == "ddp-view"
        rest = memory.vram_ledger(s.num_params, world_size, row, bucket_view=view, **kw)
        step = memory.vram_ledger(s.num_params, world_size, row, phase="step", bucket_view=view,
                                  **kw)
    return {"rest": {"parameters": rest.params, "gradients": rest.grads,
                     "optimizer": rest.optimizer, "buffers": rest.buffers, "activations": None,
                     "other": 0.0},
            "peak": step.total + activations}


# --- one rank -------------------------------------------------------------------------------

def _mark_units(model, names) -> type:
    """Give each chosen module a subclass of its own class that also derives from a fresh
    marker, so that ``train.shard_blocks`` (the package's one caller of ``fully_shard``) wraps
    exactly these modules."""
    marker = type("MemcheckUnit", (), {})
    mods = dict(model.named_modules())
    for n in names:
        m = mods[n]
        m.__class__ = type(type(m).__name__, (type(m), marker), {})
    return marker


def _wrap(model, strategy: str, wrap: str):
    """``(wrapped model, optimizer, the optimizer holding the state)``."""
    import torch

    from ..train import apply_ddp, shard_blocks
    from ..launch import device

    if strategy in ("ddp", "ddp-view", "zero1"):
        wrapped = apply_ddp(model, gradient_as_bucket_view=strategy == "ddp-view")
        if strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.Adam,
                                          lr=LR)
            return wrapped, opt, opt.optim
        opt = torch.optim.Adam(wrapped.parameters(), lr=LR)
        return wrapped, opt, opt
    marker = _mark_units(model, units(model, wrap))
    reshard = False if strategy == "fsdp2-noreshard" else None
    wrapped = shard_blocks(model.to(device()), marker, reshard_after_forward=reshard)
    opt = torch.optim.Adam(wrapped.parameters(), lr=LR)
    return wrapped, opt, opt


def gathered(model) -> tuple[list, list]:
    """FSDP2's gathered parameters (``FSDPParam.all_gather_outputs``; the same storages are
    resized to 0 between uses) of the root unit and of the other units."""
    from torch.distributed.fsdp import FSDPModule

    root, inner = [], []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for p in group.fsdp_params:
                    (root if module is model else inner).extend(p.all_gather_outputs)
    return root, inner


def rank_report(rank: int, world_size: int, spec: str, strategy: str, wrap: str = "auto",
                steps: int = 3) -> dict:
    """Rank function: run, measure and return this rank's numbers (see the module)."""
    import torch

    from ..allocations import Census, storage_of
    from ..launch import device
    from ..measure import settle_collectives

    dev = device()
    with Census() as census:
        model, batch, loss_fn = call(load(spec))
        s = shape(model, batch, strategy, wrap)
        wrapped, opt, inner = _wrap(model, strategy, wrap)
        batch = tuple(t.to(dev) for t in batch)
        census.watch(wrapped)
        after_forward = {}

        fsdp = strategy.startswith("fsdp2")

        def look(*_):  # once forward is over: what the non-root units still hold gathered, and
            # the activations autograd saved for backward (their high point in the step);
            # FSDP2 creates its gathered buffers at the first AllGather, so look them up now
            root, inner_units = gathered(wrapped) if fsdp else ([], [])
            after_forward["bytes"] = sum(st.nbytes() for t in inner_units
                                         if (st := storage_of(t)) is not None)
            after_forward["activations"] = census.breakdown(
                wrapped, inner, extra=root + inner_units)["activations"]

        hook = wrapped.register_forward_hook(look)
        for k in range(steps):
            if k == steps - 1:  # the last step: the peak, then the state between steps
                settle_collectives()
                census.reset_peak()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
            loss_fn(wrapped(*batch)).backward()
            opt.step()
            if k < steps - 1:
                opt.zero_grad(set_to_none=True)
        hook.remove()
        settle_collectives()
        extra = sum(gathered(wrapped), []) if fsdp else []
        rest = census.breakdown(wrapped, inner, extra=extra)
        at_peak = census.breakdown(wrapped, inner, at_peak=True, extra=extra)
        peak = census.peak_bytes()
        if dev.type == "cuda":  # the allocator's peak; what the census did not see is "other"
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated(dev)
            at_peak["other"] += peak - sum(at_peak.values())
    measured = {k: rest[k] for k in ("parameters", "gradients", "optimizer", "buffers")}
    measured["activations"] = after_forward.get("activations", 0)
    measured["other"] = rest["activations"] + rest["other"]
    return {"rank": rank, "shape": s, "measured": measured, "peak": peak, "peak_parts": at_peak,
            "after_forward": after_forward.get("bytes", 0), "device": dev.type}


# --- the report ------------------------------------------------------------------------------

@dataclass
class Report:
    strategy: str
    world_size: int
    wrap: str
    ranks: list = field(default_factory=list)  # [{"rank", "predicted", "measured", "peak"}]
    diagnoses: list = field(default_factory=list)  # [{"code", "message"}]

    def as_json(self) -> dict:
        return {"strategy": self.strategy, "world_size": self.world_size,
                "ranks": self.ranks, "diagnoses": self.diagnoses}


def _mb(x: float) -> str:
    from .. import vi

    return vi.nbytes(x)


def diagnose(strategy: str, world_size: int, r: dict) -> list[dict]:
    """The diagnoses for rank ``r``'s numbers (``rank_report``), each with its evidence and fix."""
    from .. import memory, vi

    s, m = r["shape"], r["measured"]
    state = m["parameters"] + m["gradients"] + m["optimizer"]
    out = []

    def add(code, message):
        out.append({"code": code, "message": message})

    unit = max(s.largest_unit, s.root_params)
    if strategy.startswith("fsdp2") and unit >= SINGLE_UNIT_SHARE * s.num_params:
        add("single_unit", f"một đơn vị FSDP giữ {vi.grouped(unit)} trong "
            f"{vi.grouped(s.num_params)} tham số "
            f"({round(100 * unit / s.num_params)}%): khi gom lại, đơn vị ấy gần như là cả mô "
            "hình, nên bộ nhớ đỉnh gần bằng khi không chia mảnh. Cách sửa: fully_shard từng "
            "khối (--wrap auto hoặc --wrap 'ten_khoi.*') trước khi fully_shard gốc.")
    if strategy in ("ddp", "zero1") and m["gradients"] and m["buffers"] >= 0.9 * m["gradients"]:
        add("bucket_copy", f"DDP giữ một bản sao gradient trong các bucket: bộ đệm "
            f"{_mb(m['buffers'])} bên cạnh gradient {_mb(m['gradients'])}. Cách sửa: "
            "DistributedDataParallel(..., gradient_as_bucket_view=True) (--strategy ddp-view): "
            "gradient nằm ngay trong bucket, bản sao biến mất.")
    if strategy.startswith("fsdp2") and r["after_forward"] > 0:
        add("no_reshard", f"sau lượt truyền xuôi các đơn vị vẫn giữ {_mb(r['after_forward'])} "
            "tham số đã gom (reshard_after_forward=False): chúng nằm đó suốt lượt truyền ngược. "
            "Cách sửa: để mặc định reshard_after_forward=True cho các khối (ZeRO-3); đổi lại "
            "một lần AllGather nữa trong lượt truyền ngược.")
    if m["activations"] > state:
        add("activations_dominate", f"activation cuối lượt xuôi {_mb(m['activations'])} lớn hơn "
            f"cả trạng thái {_mb(state)} (tham số, gradient, Adam): chia mảnh trạng thái "
            "không giúp được bao nhiêu. Cách sửa: activation checkpointing "
            "(torch.utils.checkpoint) hoặc micro-batch nhỏ hơn.")
    if world_size == 2 and strategy in ("zero1", "fsdp2", "fsdp2-noreshard"):
        whole = memory.vram_ledger(s.num_params, 1).state
        add("small_world", "N = 2: chia mảnh cho hai rank tiết kiệm nhiều nhất một nửa phần được "
            f"chia (trạng thái đo được {_mb(state)} mỗi rank, không chia là {_mb(whole)}). "
            "Thêm rank thì mỗi rank giữ 1/N.")
    fixed = m["buffers"] + m["other"]
    if fixed > state:
        add("buffers_dominate", f"bộ đệm và phần khác ({_mb(fixed)}: bucket, lô dữ liệu, "
            f"bộ đệm cố định) lớn hơn trạng thái {_mb(state)}: mô hình quá nhỏ để việc chia "
            "mảnh đáng kể; con số của sổ kế toán chỉ có nghĩa với mô hình lớn hơn.")
    return out


def check(spec: str, strategy: str, wrap: str, nproc: int, steps: int) -> Shape:
    """Refuse bad input before any process starts: the function (called once on the meta
    device, which allocates nothing), the strategy, the ranks, the memory it would need."""
    import torch

    from .. import launch

    one_of("strategy", strategy, STRATEGIES)
    int_at_least("nproc", nproc)
    int_at_least("steps", steps)
    if not isinstance(wrap, str) or not wrap:
        raise MemcheckError("--wrap phải là auto, root hoặc một mẫu tên module (ví dụ 'blocks.*').")
    fn = load(spec)
    try:
        with torch.device("meta"):
            model, batch, _ = call(fn)
    except MemcheckError:
        raise
    except Exception as e:  # noqa: BLE001 - the learner's function failed: say so, start nothing
        raise MemcheckError(f"gọi {spec}() lỗi: {type(e).__name__}: {e}") from None
    s = shape(model, batch, strategy, wrap)
    p = launch.plan(nproc, "auto")
    if p.backend == "gloo" and nproc > 4 * (os.cpu_count() or 1):
        raise MemcheckError(f"--nproc {nproc}: máy này có {os.cpu_count()} lõi CPU, chạy được "
                            f"tối đa {4 * (os.cpu_count() or 1)} rank gloo.")
    need = predict(strategy, s, nproc)["peak"] + 2 * s.input_bytes
    have = _free_bytes(p.backend)
    if need * (1 if p.backend == "nccl" else nproc) > have:
        raise MemcheckError(f"mô hình không vừa: sổ kế toán cần khoảng {_mb(need)} mỗi rank "
                            f"(chưa kể activation) cho {nproc} rank, máy còn {_mb(have)}.")
    return s


def _free_bytes(backend: str) -> float:
    import torch

    if backend == "nccl":
        return float(torch.cuda.mem_get_info(0)[0])
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return float(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError):
        return float("inf")


def run(spec: str, strategy: str = "ddp", wrap: str = "auto", nproc: int = 2, steps: int = 3,
        timeout: float = 300.0) -> Report:
    """Check the input, run ``rank_report`` on ``nproc`` ranks, compare with the ledger."""
    from .. import launch

    check(spec, strategy, wrap, nproc, steps)
    results = launch.spawn(rank_report, spec, strategy, wrap, steps, world_size=nproc,
                           timeout=timeout, output="none")
    report = Report(strategy, nproc, wrap)
    for r in results:
        pred = predict(strategy, r["shape"], nproc, r["measured"]["activations"])
        report.ranks.append({"rank": r["rank"], "predicted": pred["rest"],
                             "measured": r["measured"],
                             "peak": {"predicted": pred["peak"], "measured": r["peak"],
                                      "parts": r["peak_parts"]}})
    report.diagnoses = diagnose(strategy, nproc, results[0])
    return report


def table(report: Report) -> str:
    """The report as the command prints it, in Vietnamese (bytes)."""
    from .. import vi

    lines = [f"memcheck: {STRATEGIES[report.strategy]}, {report.world_size} rank, "
             f"--wrap {report.wrap}"]
    for r in report.ranks:
        lines += ["", f"rank {r['rank']} (byte, giữa hai bước; activation cuối lượt xuôi)",
                  f"{'':<30}{'dự đoán':>14}{'đo được':>14}{'chênh':>14}"]
        for c in CATEGORIES:
            p, m = r["predicted"][c], r["measured"][c]
            pred = "—" if p is None else vi.grouped(p)
            diff = "—" if p is None else vi.grouped(m - p, " ")
            lines.append(f"{NAMES[c]:<30}{pred:>14}{vi.grouped(m):>14}{diff:>14}")
        pk = r["peak"]
        lines.append(f"{'bộ nhớ đỉnh':<30}{vi.grouped(pk['predicted']):>14}"
                     f"{vi.grouped(pk['measured']):>14}"
                     f"{vi.grouped(pk['measured'] - pk['predicted'], ' '):>14}")
        if pk.get("parts"):
            lines.append("  lúc đỉnh đo được: " + "; ".join(
                f"{NAMES[c].split(' (')[0]} {vi.grouped(v)}" for c, v in pk["parts"].items() if v))
    lines += ["", "Chẩn đoán:" if report.diagnoses else "Chẩn đoán: không thấy lỗi nào."]
    lines += [f"- [{d['code']}] {d['message']}" for d in report.diagnoses]
    lines.append("(dự đoán đỉnh = sổ kế toán lúc phase=\"step\" + activation đo được: sổ kế toán "
                 "nhận activation làm đầu vào)")
    return "\n".join(lines)


def plot(report: Report, path: str) -> None:
    """Bars per category, predicted beside measured (rank 0), and the peak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..style import PALETTE

    r = report.ranks[0]
    cats = list(CATEGORIES) + ["peak"]
    pred = [(r["predicted"][c] or 0) for c in CATEGORIES] + [r["peak"]["predicted"]]
    meas = [r["measured"][c] for c in CATEGORIES] + [r["peak"]["measured"]]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(cats))
    ax.bar([x - 0.2 for x in xs], [v / 1e6 for v in pred], 0.4, label="dự đoán (sổ kế toán)",
           color=PALETTE["blue"])
    ax.bar([x + 0.2 for x in xs], [v / 1e6 for v in meas], 0.4, label="đo được (cấp phát)",
           color=PALETTE["orange"])
    ax.set_xticks(list(xs), [NAMES.get(c, "bộ nhớ đỉnh") for c in cats], rotation=20)
    ax.set_ylabel("MB mỗi rank (rank 0)")
    ax.set_title(f"memcheck: {report.strategy}, N = {report.world_size}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
