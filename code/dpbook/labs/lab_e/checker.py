"""The checker of lab E: run a learner's ``ShardedOptimizer`` and ``fully_shard_scratch`` on the
ranks and judge them, item by item.

``check_files(paths)`` starts the ranks once (``launch.spawn``) and, in the same processes,
computes the references once (plain Adam, FSDP2's ``fully_shard`` through
``train.shard_blocks``, DDP's peak memory, what a plain forward keeps) and then runs every file:
``run_checks`` on the ranks measures, ``items`` in the caller judges (pure, testable without
processes). ``check(path)`` is one file. ``python -m dpbook.labs.lab_e.checker FILE`` prints the
report and exits with 0 only if every item passes.

Items, on N ranks (2 on the CPU):

* ``defines``: the file loads and defines both names;
* ``zero1_weights``: ``ShardedOptimizer(params, Adam)`` on averaged gradients gives plain Adam's
  weights after ``STEPS`` steps, on every rank (``TOL``);
* ``zero1_state``: each rank's optimizer state is at most what the heaviest rank of the greedy
  partition holds (``greedy_loads``; the looser T/N + p_max let a split in parameter order pass),
  and the ranks' states add up to plain Adam's (each parameter's
  state lives on exactly one rank);
* ``fsdp_weights``: ``fully_shard_scratch`` on ``lab_e.units`` gives FSDP2's weights on the same
  units after ``STEPS`` steps (``TOL``);
* ``fsdp_state``: parameters, gradients and Adam state per rank equal the ledger's FULL_SHARD row
  (``memory.vram_ledger``) for the padded parameter count;
* ``fsdp_bytes``: one step's AllGather in forward, AllGather in backward and ReduceScatter
  (``measure.CommLog``) equal ``costs.fsdp_step_bytes`` for the padded bytes: 3(N−1)/N·Ψ;
* ``fsdp_freed``: what a forward leaves allocated is what the plain model's forward leaves
  (activations): no full parameter survives its unit's forward;
* ``fsdp_peak``: the peak memory of a step is below DDP's (``measure.peak_memory``).
"""

from __future__ import annotations

import importlib.util
import math
import traceback
from dataclasses import dataclass
from pathlib import Path

from ... import vi
from ...checks import int_at_least
from .. import preflight, report
from ..report import Item, Verdict
from . import build_model, units

STEPS = 5
TOL = 1e-6
LR = 1e-2
ADAM_BYTES = 8  # two fp32 moments per parameter
NAMES = ("ShardedOptimizer", "fully_shard_scratch")


@dataclass(frozen=True)
class Workload:
    """The model (``lab_e.build_model`` arguments) and the per-rank batch."""

    model_kwargs: dict
    batch_size: int


# CPU: about 2 800 parameters; GPU: about 3,2 M, so that CUDA's allocator rounding (512 B
# blocks) is small against a unit's bytes. Same code path.
WORKLOADS = {"cpu": Workload({}, 8),
             "cuda": Workload({"in_dim": 1024, "hidden": 1024, "depth": 3}, 64)}


@dataclass(frozen=True)
class Result(Verdict):
    """The verdict on one file: ``passed`` if every item passed; ``raw`` is what rank 0
    measured (``run_checks``)."""

    path: str
    world_size: int
    items: tuple[Item, ...]
    raw: dict
    expected: "Expected | None" = None  # what the items were judged against (this workload)

    def __str__(self) -> str:
        return "\n".join(self.report_lines(f"Kiểm tra {Path(self.path).name} ({self.world_size} rank):"))


# --- what the formulas say (pure) -------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """Parameter counts of the lab's model on ``world_size`` ranks and what they predict."""

    world_size: int
    num_params: int  # P
    padded_params: int  # sum over parameters of N * ceil(numel / N)
    ledger_state: float  # memory.vram_ledger(P, N, "FULL_SHARD").state, bytes
    state: float  # the same row for the padded count: what a rank must hold
    volume: object  # costs.fsdp_step_bytes(4 * padded, N): bytes one rank sends in one step
    smallest_unit: int  # parameters of the smallest unit

    @property
    def slack(self) -> float:
        """Bytes a forward may keep beyond the plain model's: half the smallest unit's full
        parameters (fp32), less than any unit a version forgets to free. MemTracker (CPU) and
        CUDA's allocator (which rounds blocks up to 512 B) count a few bytes of bookkeeping
        differently from run to run; a full unit is far more."""
        return 4 * self.smallest_unit / 2

    @property
    def padding(self) -> int:
        return self.padded_params - self.num_params


def expected(model_kwargs: dict, world_size: int) -> Expected:
    """Counted on the ``meta`` device: no memory, no process."""
    import torch

    from ...costs import fsdp_step_bytes
    from ...memory import vram_ledger

    int_at_least("world_size", world_size)
    with torch.device("meta"):
        model = build_model(**model_kwargs)
    sizes = [p.numel() for p in model.parameters()]
    num, padded = sum(sizes), sum(world_size * math.ceil(s / world_size) for s in sizes)
    smallest = min(sum(p.numel() for p in u.parameters()) for u in units(model))
    return Expected(world_size, num, padded,
                    vram_ledger(num, world_size, "FULL_SHARD").state,
                    vram_ledger(padded, world_size, "FULL_SHARD").state,
                    fsdp_step_bytes(4 * padded, world_size, "FULL_SHARD"), smallest)


def expected_for(world_size: int = 2, backend: str = "auto") -> Expected:
    """``expected`` for the workload a check on ``world_size`` ranks runs: the device that
    ``launch.plan`` picks (the CPU model under gloo, ``WORKLOADS["cuda"]`` under NCCL)."""
    from ...launch import plan

    device_type = plan(world_size, backend).device_type
    return expected(WORKLOADS[device_type].model_kwargs, world_size)


# --- on the ranks -----------------------------------------------------------------------------


def load(path: str, index: int = 0):
    """Import the learner's file as a fresh module (``index`` keeps two files apart)."""
    spec = importlib.util.spec_from_file_location(f"dpbook_lab_e_file{index}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _error(exc: BaseException) -> str:
    lines = traceback.format_exception(exc)
    return "".join(lines[-3:]).strip()


def _batches(rank: int, world_size: int, model, wl: Workload, dev, count: int) -> list:
    from ...data import rank_batch, synthetic_regression

    global_batch = wl.batch_size * world_size
    ds = synthetic_regression(count * global_batch, model.blocks[0].linear.in_features,
                              model.head.out_features)
    return [rank_batch(ds.tensors, rank, wl.batch_size, dev, start=k * global_batch)
            for k in range(count)]


def _loss(model, batch):
    import torch

    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def _gather_objects(obj, world_size: int) -> list:
    import torch.distributed as dist

    out = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def _max_diff(a: dict, b: dict) -> float:
    if a.keys() != b.keys():
        return math.inf
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def zero1(module, rank: int, world_size: int, wl: Workload, dev) -> dict:
    """``ShardedOptimizer(Adam)`` and plain Adam, both on the gradients averaged over the ranks
    (an AllReduce, as DDP would give them)."""
    import torch
    import torch.distributed as dist

    from ...measure import state_bytes

    model, ref = build_model(**wl.model_kwargs).to(dev), build_model(**wl.model_kwargs).to(dev)
    opt = module.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=LR)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
    for batch in _batches(rank, world_size, model, wl, dev, STEPS):
        _loss(model, batch).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            dist.all_reduce(p.grad)
            p.grad /= world_size
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
    diff = _max_diff({k: v.detach() for k, v in model.state_dict().items()},
                     {k: v.detach() for k, v in ref.state_dict().items()})
    return {"max_diff": max(_gather_objects(diff, world_size)),
            "optimizer_bytes": _gather_objects(state_bytes(model, opt).optimizer, world_size),
            "reference_bytes": state_bytes(ref, ref_opt).optimizer,
            "largest_bytes": max(p.numel() for p in ref.parameters()) * ADAM_BYTES,
            "greedy_bytes": [ADAM_BYTES * n for n in greedy_loads(
                [p.numel() for p in ref.parameters()], world_size)]}


def greedy_loads(sizes: list[int], world_size: int) -> list[int]:
    """Elements per rank when each parameter, largest first, goes to the lightest rank (the
    partition the lab asks for, ``ZeroRedundancyOptimizer``'s): its heaviest rank is the bound
    a partition "by size" must meet."""
    load = [0] * world_size
    for n in sorted(sizes, reverse=True):
        load[load.index(min(load))] += n
    return load


def _full_from_shards(model, shapes: dict, world_size: int) -> dict:
    """Full weights rebuilt from the shards of the layout the lab prescribes (``solution``'s
    docstring): each parameter flattened, zero-padded, rank r holding the r-th equal slice."""
    import torch
    import torch.distributed as dist

    params = dict(model.named_parameters())
    if params.keys() != shapes.keys():
        raise ValueError(f"tên tham số sau khi chia mảnh khác tên ban đầu: "
                         f"{sorted(set(params) ^ set(shapes))[:3]}")
    full = {}
    for name, shape in shapes.items():
        shard = params[name].detach().contiguous()
        buf = torch.empty(world_size * shard.numel(), dtype=shard.dtype, device=shard.device)
        dist.all_gather_single(buf, shard)
        full[name] = buf[:shape.numel()].view(shape).cpu()
    return full


def kept_by_forward(run, *tracked) -> tuple[int, object]:
    """Bytes allocated by ``run()`` and still alive when it returns (its result held), and
    the result: ``kept_by`` without a probe."""
    kept, result, _ = kept_by(run, *tracked)
    return kept, result


def kept_by(run, *tracked, probe=None) -> tuple[int, object, int | None]:
    """Bytes allocated by ``run()`` and still alive when it returns (its result held): on a GPU
    from CUDA's allocator statistics, on the CPU from PyTorch's ``MemTracker`` (current bytes
    after minus before); the result; and, if ``probe`` is a module, the same count at the moment
    its forward starts (a pre-hook that runs before every other one: before a unit gathers its
    own parameters), else ``None``."""
    import torch

    from ...launch import device
    from ...measure import settle_collectives

    mid: list[int] = []
    if device().type == "cuda":
        def current():
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        tracker = None
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(*tracked)

        def current():
            settle_collectives()  # gloo's worker may still hold a finished AllGather's output
            snap = tracker.get_tracker_snapshot("current")
            return sum(v.get("Total", 0) for k, v in snap.items()
                       if torch.device(k).type == "cpu")
    handle = None
    if probe is not None:
        handle = probe.register_forward_pre_hook(lambda *_: mid.append(current() - before),
                                                 prepend=True)
    try:
        if tracker is None:
            before = current()
            result = run()
            kept = current() - before
        else:
            with tracker:
                before = current()
                result = run()
                kept = current() - before
    finally:
        if handle is not None:
            handle.remove()
    return kept, result, (mid[0] if mid else None)


def _alloc_bytes(t) -> int:
    """What ``t``'s allocation counts in ``kept_by``: CUDA's allocator rounds blocks up to
    512 B."""
    n = t.untyped_storage().nbytes()
    return -(-n // 512) * 512 if t.device.type == "cuda" else n


def references(rank: int, world_size: int, wl: Workload, dev) -> dict:
    """What every file is compared with: FSDP2's final weights, DDP's peak, a plain forward's
    kept bytes."""
    import gc

    import torch

    from ...measure import peak_memory
    from ...models import Block
    from ...train import apply_ddp, full_state_dict, shard_blocks

    model = build_model(**wl.model_kwargs).to(dev)
    shard_blocks(model, Block, separate=[model.head])
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    batches = _batches(rank, world_size, model, wl, dev, STEPS + 1)
    for batch in batches[:STEPS]:
        _loss(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    fsdp2 = full_state_dict(model)
    del model, opt
    # FSDP2 holds reference cycles: without a collection its shards stay allocated and CUDA's
    # peak below (reset to the current allocation) would count them in DDP's peak (review D13)
    gc.collect()
    ddp = apply_ddp(build_model(**wl.model_kwargs))
    opt = torch.optim.Adam(ddp.parameters(), lr=LR)
    _step(ddp, opt, batches[0])  # DDP rebuilds its buckets after the first step
    ddp_peak = peak_memory(lambda: _step(ddp, opt, batches[1]), ddp, opt).peak
    plain = build_model(**wl.model_kwargs).to(dev)
    plain_kept, loss, plain_mid = kept_by(lambda: _loss(plain, batches[-1]), plain,
                                          probe=units(plain)[-1])
    loss.backward()
    plain.zero_grad(set_to_none=True)
    return {"fsdp2": fsdp2, "ddp_peak": ddp_peak, "plain_kept": plain_kept,
            "plain_mid": plain_mid, "batches": batches,
            "grads0": _averaged_grads(plain, batches[0], world_size)}


def _averaged_grads(model, batch, world_size: int) -> dict:
    """The gradient of the first step that every data-parallel version must reach: each rank's
    own gradient, averaged over the ranks (what DDP leaves)."""
    import torch.distributed as dist

    _loss(model, batch).backward()
    out = {}
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad)
        out[name] = (p.grad / world_size).cpu()
    model.zero_grad(set_to_none=True)
    return out


def _shard_grads_vs(model, shapes: dict, world_size: int, ref: dict) -> tuple[float, float | None]:
    """The shards' gradients put together (the lab's layout) against ``ref``: the largest
    difference, and <got, ref> / <ref, ref> (N when the sum was not divided by N)."""
    import torch
    import torch.distributed as dist

    params = dict(model.named_parameters())
    if params.keys() != shapes.keys() or any(p.grad is None for p in params.values()):
        return math.inf, None
    got = {}
    for name, shape in shapes.items():
        g = params[name].grad.detach().contiguous()
        buf = torch.empty(world_size * g.numel(), dtype=g.dtype, device=g.device)
        dist.all_gather_single(buf, g)
        got[name] = buf[:shape.numel()].view(shape).cpu()
    num = sum((got[k].double() * ref[k].double()).sum().item() for k in ref)
    den = sum((ref[k].double() ** 2).sum().item() for k in ref)
    return _max_diff(got, ref), num / max(den, 1e-30)


def _step(model, opt, batch) -> None:
    _loss(model, batch).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def fsdp(module, rank: int, world_size: int, wl: Workload, dev, refs: dict) -> dict:
    """``fully_shard_scratch`` on the lab's units, trained like the FSDP2 reference."""
    import torch

    from ...measure import CommLog, peak_memory, state_bytes

    model = build_model(**wl.model_kwargs).to(dev)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    module.fully_shard_scratch(model, units(model))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    shard_numels = {n: p.numel() for n, p in model.named_parameters()}
    batches, out = refs["batches"], {}

    def first_step():  # also the gradient of the first backward, before Adam hides its scale
        _loss(model, batches[0]).backward()
        out["grad_diff"], out["grad_ratio"] = _shard_grads_vs(model, shapes, world_size,
                                                              refs["grads0"])
        opt.step()
        opt.zero_grad(set_to_none=True)

    # What a whole step leaves allocated beyond the Adam state it creates: nothing, unless a
    # full parameter survives it (review G3).
    rest, _, _ = kept_by(first_step, model, opt)
    out["rest_kept"] = rest - sum(_alloc_bytes(v) for st in opt.state.values()
                                  for v in st.values() if isinstance(v, torch.Tensor)
                                  and v.device.type == dev.type)
    for k, batch in enumerate(batches[:STEPS]):
        if k == 0:
            continue
        log = CommLog()
        with log if k == 1 else _nothing():
            _loss(model, batch).backward()
            opt.step()
        if k == 1:
            out["volume"] = log.volume()
        if k == STEPS - 1:
            out["state"] = state_bytes(model, opt)
        opt.zero_grad(set_to_none=True)
    out["max_diff"] = _max_diff(_full_from_shards(model, shapes, world_size), refs["fsdp2"])
    out["shard_numels"] = shard_numels
    kept, loss, mid = kept_by(lambda: _loss(model, batches[-1]), model, opt,
                              probe=units(model)[-1])
    loss.backward()  # free the graph the way training does (weights are not stepped)
    opt.zero_grad(set_to_none=True)
    out["kept"], out["mid"] = kept, mid
    out["plain_kept"], out["plain_mid"] = refs["plain_kept"], refs["plain_mid"]
    out["peak"] = peak_memory(lambda: _step(model, opt, batches[-1]), model, opt).peak
    out["ddp_peak"] = refs["ddp_peak"]
    return out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_checks(rank: int, world_size: int, paths: list[str], device_type: str | None = None
               ) -> list[dict]:
    """Rank function for ``launch.spawn``: the references once, then each file in turn. Returns
    one dict per file with what this rank measured; an error in one part is recorded as text
    (every rank meets the same error in the lab's deterministic code, so none waits alone)."""
    import gc

    from ...launch import device

    dev = device()
    wl = WORKLOADS[device_type or dev.type]
    refs = references(rank, world_size, wl, dev)
    results = []
    for i, path in enumerate(paths):
        raw: dict = {"path": path}
        try:
            module = load(path, i)
            raw["missing"] = [n for n in NAMES if not hasattr(module, n)]
        except Exception as exc:  # noqa: BLE001 - reported to the learner, item by item
            raw["load_error"] = _error(exc)
            results.append(raw)
            continue
        for key, part in (("zero1", lambda: zero1(module, rank, world_size, wl, dev)),
                          ("fsdp", lambda: fsdp(module, rank, world_size, wl, dev, refs))):
            try:
                raw[key] = part()
            except Exception as exc:  # noqa: BLE001
                raw[key] = {"error": _error(exc)}
            gc.collect()
        results.append(raw)
    return results


# --- judging (pure) ---------------------------------------------------------------------------


def _mb(n: float) -> str:
    return f"{vi.grouped(n)} B"


def defines_item(raw: dict) -> Item:
    title = "File nạp được và định nghĩa ShardedOptimizer, fully_shard_scratch"
    if "load_error" in raw:
        return Item("defines", title, False, raw["load_error"].splitlines()[-1],
                    "sửa lỗi khi nạp file (chạy thử `python FILE`).")
    missing = raw.get("missing", [])
    return Item("defines", title, not missing,
                f"thiếu {', '.join(missing)}" if missing else "",
                "file phải định nghĩa đúng hai tên này, ở mức ngoài cùng.")


def _error_item(key: str, title: str, error: str) -> Item:
    last = error.splitlines()[-1] if error else "lỗi"
    hint = ("bạn chưa viết phần này (bản khởi đầu ném NotImplementedError)."
            if "NotImplementedError" in error else "đọc dòng lỗi; chạy thử từng bước với %%ranks.")
    return Item(key, title, False, f"ném lỗi: {last}", hint)


def _weights_item(key: str, title: str, diff: float, hint: str) -> Item:
    """Final weights against the reference run: the largest difference, within ``TOL``."""
    return Item(key, title, diff <= TOL,
                f"sai khác lớn nhất {vi.sci(diff, 1)} (ngưỡng {vi.sci(TOL, 0)})", hint)


ZERO1_TITLES = {"zero1_weights": f"ShardedOptimizer(Adam) cho cùng trọng số với Adam thường sau "
                                 f"{STEPS} bước",
                "zero1_state": "Trạng thái bộ tối ưu được chia giữa các rank"}


def zero1_items(raw: dict) -> list[Item]:
    if "error" in raw:
        return [_error_item(k, t, raw["error"]) for k, t in ZERO1_TITLES.items()]
    weights = _weights_item("zero1_weights", ZERO1_TITLES["zero1_weights"], raw["max_diff"],
                   "mỗi rank gọi bộ tối ưu bên trong trên các tham số của mình, rồi mọi rank "
                   "nhận tham số đã cập nhật từ rank sở hữu (broadcast, cùng thứ tự ở mọi rank).")
    per_rank, total, largest = raw["optimizer_bytes"], raw["reference_bytes"], raw["largest_bytes"]
    n = len(per_rank)
    # The greedy partition's heaviest rank (review G6: T/N + p_max let a split in parameter
    # order pass); measurements without it (older raw dicts) keep the looser bound.
    bound = max(raw["greedy_bytes"]) if "greedy_bytes" in raw else total / n + largest
    ok = max(per_rank) <= bound and sum(per_rank) == total
    detail = (f"mỗi rank {' / '.join(_mb(b) for b in per_rank)}; chia tham lam theo kích thước: "
              f"rank nặng nhất {_mb(bound)}; tổng các rank {_mb(sum(per_rank))}, Adam thường "
              f"{_mb(total)}")
    if sum(per_rank) < total:
        hint = ("tổng các rank phải bằng Adam thường: self.state là trạng thái của bộ tối ưu "
                "bên trong, chỉ cho các tham số rank này sở hữu.")
    elif sum(per_rank) > total:
        hint = ("mỗi rank chỉ tạo bộ tối ưu bên trong cho các tham số nó sở hữu; chia theo "
                "kích thước (tham số lớn nhất trước, cho rank đang nhẹ nhất).")
    else:
        hint = ("mỗi tham số ở đúng một rank, nhưng cách chia không cân: chia theo kích thước, "
                "lần lượt từ tham số lớn nhất, giao cho rank đang nhẹ nhất (không chia theo "
                "thứ tự tham số).")
    return [weights, Item("zero1_state", ZERO1_TITLES["zero1_state"], ok, detail, hint)]


FSDP_TITLES = {"fsdp_weights": f"fully_shard_scratch cho cùng trọng số với FSDP2 (fully_shard) "
                               f"sau {STEPS} bước",
               "fsdp_state": "Trạng thái mỗi rank = dòng FULL_SHARD của sổ kế toán (cộng padding)",
               "fsdp_bytes": "Byte mỗi bước: AllGather xuôi + AllGather ngược + ReduceScatter "
                             "= 3(N−1)/N·Ψ",
               "fsdp_freed": "Tham số đầy đủ được bỏ ngay khi đơn vị của nó tính xong (giữa "
                             "lượt xuôi, sau lượt xuôi, sau cả bước)",
               "fsdp_peak": "Bộ nhớ đỉnh thấp hơn DDP"}


def fsdp_items(raw: dict, exp: Expected) -> list[Item]:
    if "error" in raw:
        return [_error_item(k, t, raw["error"]) for k, t in FSDP_TITLES.items()]
    weights = _weights_item("fsdp_weights", FSDP_TITLES["fsdp_weights"], raw["max_diff"],
                   "gradient của shard là phần của rank này trong tổng gradient đầy đủ của mọi "
                   "rank, chia cho N (trung bình như DDP); giữ đúng cách lưu shard của đề bài.")
    if "grad_diff" in raw:  # the first step's gradient: Adam hides a gradient's scale
        n, ratio = exp.world_size, raw.get("grad_ratio")
        scaled = ratio is not None and abs(ratio - n) < 0.01 * n
        detail = (f"{weights.detail}; gradient của bước đầu: sai khác {vi.sci(raw['grad_diff'], 1)}"
                  + (f", gấp {vi.number(ratio, 3)} lần trung bình" if scaled else ""))
        hint = (f"gradient của shard gấp N = {n} lần trung bình: ReduceScatter cộng gradient "
                f"của các rank, phải chia cho N. Adam gần như không đổi khi gradient nhân một "
                f"hằng số, nên trọng số có thể vẫn gần đúng; SGD thì không."
                if scaled else weights.hint)
        weights = Item("fsdp_weights", weights.title,
                       weights.passed and raw["grad_diff"] <= TOL, detail, hint)
    st = raw["state"]
    state_ok = st.total == exp.state
    state = Item("fsdp_state", FSDP_TITLES["fsdp_state"], state_ok,
                 f"đo {_mb(st.total)} (tham số {_mb(st.params)}, gradient {_mb(st.grads)}, Adam "
                 f"{_mb(st.optimizer)}); sổ kế toán {_mb(exp.ledger_state)} + padding "
                 f"{exp.padding} phần tử = {_mb(exp.state)}",
                 "mỗi tham số phải là một shard 1 chiều ceil(numel/N) phần tử, và gradient của "
                 "nó (shard.grad) cùng kích thước: đừng giữ gradient đầy đủ.")
    extra = raw["kept"] - raw["plain_kept"]
    mid = (raw["mid"] - raw["plain_mid"]) if raw.get("mid") is not None else None
    rest = raw.get("rest_kept")
    kept_nothing = extra <= exp.slack and (mid is None or mid <= exp.slack)
    v, e = raw["volume"], exp.volume
    parts = (("all_gather_forward", "AG xuôi"), ("all_gather_backward", "AG ngược"),
             ("reduce_scatter", "RS"), ("all_reduce", "AR"))
    exact = all(abs(getattr(v, f) - getattr(e, f)) < 0.5 for f, _ in parts)
    # Review G5: regathering in backward only the units whose backward needs a full parameter
    # is right and cheaper, when nothing was kept from the forward instead.
    lazy = (not exact and kept_nothing and v.all_gather_backward < e.all_gather_backward
            and all(abs(getattr(v, f) - getattr(e, f)) < 0.5 for f, _ in parts
                    if f != "all_gather_backward"))
    seen = ", ".join(f"{name} {_mb(getattr(v, f))}" for f, name in parts if getattr(v, f))
    volume = Item("fsdp_bytes", FSDP_TITLES["fsdp_bytes"], exact or lazy,
                  f"đo {seen or 'không có phép toán tập thể nào'}; công thức mỗi loại "
                  f"{_mb(e.all_gather_forward)}, tổng {_mb(e.total)}"
                  + ("; AG ngược ít hơn: chỉ gom lại các đơn vị mà lượt ngược cần tham số đầy "
                     "đủ, không giữ gì từ lượt xuôi (hợp lệ)" if lazy else ""),
                  _bytes_hint(v, e))
    checks = [f"khi đơn vị cuối bắt đầu thừa {_mb(max(mid, 0))}" if mid is not None else None,
              f"lượt xuôi để lại {_mb(raw['kept'])}, mô hình thường (chỉ activation) "
              f"{_mb(raw['plain_kept'])}: thừa {_mb(max(extra, 0))}",
              f"sau cả bước còn {_mb(max(rest, 0))} ngoài trạng thái Adam"
              if rest is not None else None]
    if extra > exp.slack:
        hint = ("sau khi một đơn vị tính xong, đừng giữ tham số đầy đủ (kể cả trong autograd: "
                "dùng torch.autograd.graph.saved_tensors_hooks để autograd chỉ nhớ cách gom lại).")
    elif mid is not None and mid > exp.slack:
        hint = ("tham số đầy đủ của các đơn vị trước vẫn còn khi đơn vị cuối bắt đầu: bỏ chúng "
                "ngay trong post-forward hook của CHÍNH đơn vị ấy, đừng đợi cả mô hình tính xong.")
    else:
        hint = ("bản gom lại cho lượt ngược vẫn còn sau bước: bỏ nó ngay khi đơn vị tính xong "
                "lượt ngược (ví dụ trong backward của autograd.Function), đừng giữ tới bước sau.")
    freed_ok = kept_nothing and (rest is None or rest <= exp.slack)
    freed = Item("fsdp_freed", FSDP_TITLES["fsdp_freed"], freed_ok,
                 "; ".join(c for c in checks if c) + f" (cho phép dưới nửa đơn vị nhỏ nhất, "
                 f"{_mb(exp.slack)})", hint)
    peak_ok = raw["peak"] < raw["ddp_peak"]
    peak = Item("fsdp_peak", FSDP_TITLES["fsdp_peak"], peak_ok,
                f"{_mb(raw['peak'])} so với DDP {_mb(raw['ddp_peak'])} "
                f"({vi.percent(raw['peak'] / raw['ddp_peak'], 0)})",
                "tham số, gradient và trạng thái Adam phải là shard; bản đầy đủ chỉ sống trong "
                "lúc đơn vị của nó tính.")
    return [weights, state, volume, freed, peak]


def _bytes_hint(v, e) -> str:
    if v.all_reduce:
        return ("gradient đi bằng AllReduce (gửi 2(N−1)/N thay vì (N−1)/N): dùng "
                "dist.reduce_scatter_tensor, mỗi rank chỉ nhận tổng của phần shard của mình.")
    if v.all_gather_backward < e.all_gather_backward:
        return ("lượt ngược không gom lại tham số: bản đầy đủ đã được giữ từ lượt xuôi (đó là "
                "SHARD_GRAD_OP, 2(N−1)/N·Ψ); hãy giải phóng nó và gom lại trong lượt ngược.")
    return "mỗi đơn vị gom một lần trước khi tính, ở mỗi lượt; ReduceScatter một lần mỗi gradient."


def items(raw: dict, exp: Expected) -> tuple[Item, ...]:
    """Rank 0's measurements of one file (``run_checks``) as the report's items."""
    first = defines_item(raw)
    if not first.passed:
        rest = [Item(k, t, False, "không chạy được") for k, t in
                {**ZERO1_TITLES, **FSDP_TITLES}.items()]
        return (first, *rest)
    return (first, *zero1_items(raw["zero1"]), *fsdp_items(raw["fsdp"], exp))


# --- the caller ---------------------------------------------------------------------------------


def check_files(paths, world_size: int = 2, timeout: float = 180.0, verbose: bool = True,
                backend: str = "auto") -> list[Result]:
    """Check every file of ``paths`` in one launch on ``world_size`` ranks; print each report
    if ``verbose``; return the ``Result`` of each, in order."""
    from ...launch import plan, spawn

    int_at_least("world_size", world_size, 2)
    paths = [str(preflight.source(p)) for p in paths]
    device_type = plan(world_size, backend).device_type
    per_rank = spawn(run_checks, paths, device_type, world_size=world_size, backend=backend,
                     timeout=timeout, output="rank0")
    exp = expected(WORKLOADS[device_type].model_kwargs, world_size)
    results = []
    for raw in per_rank[0]:
        results.append(Result(raw["path"], world_size, items(raw, exp), raw, exp))
    if verbose:
        print("\n\n".join(str(r) for r in results))
    return results


def check(path, world_size: int = 2, timeout: float = 180.0, verbose: bool = True,
          backend: str = "auto") -> Result:
    """``check_files([path])[0]``."""
    return check_files([path], world_size, timeout, verbose, backend)[0]


def main(argv=None) -> int:
    """``python -m dpbook.labs.lab_e.checker FILE [--nproc N] [--timeout S]``."""
    return report.command_line(
        argv, "lab_e", "Chấm Bài E: ShardedOptimizer (ZeRO-1) và fully_shard_scratch (FSDP) của "
        "bạn.", "file Python định nghĩa ShardedOptimizer và fully_shard_scratch", check, 300.0,
        min_nproc=2)


if __name__ == "__main__":
    raise SystemExit(main())
