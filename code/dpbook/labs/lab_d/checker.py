"""The checker of lab D: run a learner's ``ring_all_reduce`` and ``MyDDP`` on 2 ranks, judge them.

``check(path)`` starts the ranks (``launch.spawn``; ``check_files`` judges several files, each
in its own launches, so that one file that hangs costs only its own result). On every rank
``measure`` loads the file and measures, without judging: the ring against ``dist.all_reduce``
on ``common.RING_SHAPES`` and every message it sends (``measure.CommLog`` records ``send``),
at N = 2, 3 and 4 (``RING_WORLDS``: at N = 2 a ring that passes the whole tensor around sends
2(N-1)/N of it too); ``MyDDP`` against PyTorch's DDP on ``common.LabNet`` with the same cap and
data (gradients after one step, weights after ``common.STEPS`` SGD steps), its AllReduces per
step, how many AllReduces (and bytes) had been issued when each gradient became ready (hooks
registered *before* MyDDP's, so they run first), how long rank 0's backward takes while the
other ranks start theirs ``LATE_S`` late (a hook that waits for its AllReduce waits for them),
and the state after construction from a different seed on each rank. The pure ``judge_*``
functions turn those measurements into items; ``Result`` prints them as in lab A.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ... import buckets, launch, vi
from ...measure import CommLog
from .. import preflight, report
from ..report import Item, Verdict
from . import NAMES, common, load

GRAD_TOL = 1e-6  # fp32: the same sums in another order differ by ~1e-8
RING_TOL = 1e-5  # relative; N = 2 sums two numbers, exactly as gloo does
RING_WORLDS = (2, 3, 4)  # the ring is judged at each of these N: at N = 2 a ring that passes
# the whole tensor sends 2(N-1)/N of it too; at 3 and 4 it sends more (review G1)
LATE_S = 0.4  # how late the other ranks start the backward that shows a blocking hook

_LOAD_HINT = "file phải định nghĩa ring_all_reduce(tensor) và class MyDDP(torch.nn.Module)."


@dataclass(frozen=True)
class Result(Verdict):
    """The verdict on one file: ``passed`` if every item passed; ``reports``: what each rank
    measured (``None`` when the launch itself failed)."""

    path: str
    world_size: int
    items: tuple[Item, ...]
    reports: tuple[dict, ...] | None = None

    def __str__(self) -> str:
        return "\n".join(self.report_lines(f"Kiểm tra {Path(self.path).name} ({self.world_size} rank):"))


# ---------------------------------------------------------------------------------- on the ranks

def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def measure_ring(ring, rank: int, shapes=common.RING_SHAPES) -> list[dict]:
    """Per shape: the largest relative error against ``dist.all_reduce``, the bytes this rank
    sent and the other collectives it issued; stops at the first exception (the ranks'
    point-to-point messages would no longer pair up)."""
    out = []
    for shape in shapes:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(7 * rank + len(out)))
        x = x.to(launch.device())
        expected = x.clone()
        dist.all_reduce(expected)
        got = x.clone()
        row = {"shape": tuple(shape), "numel": x.numel(), "nbytes": x.numel() * x.element_size()}
        try:
            with CommLog() as log:
                ring(got)
        except Exception as exc:  # noqa: BLE001 - the learner's code: report, do not crash
            out.append(row | {"error": _error(exc)})
            break
        scale = expected.abs().max().item() if x.numel() else 1.0
        diff = (got - expected).abs().max().item() / max(scale, 1e-30) if x.numel() else 0.0
        messages = [r.nbytes for r in log.records if r.collective == "send"]
        others = sorted({r.collective for r in log.records if r.collective != "send"})
        out.append(row | {"diff": diff, "sent": sum(messages), "messages": messages,
                          "others": others})
    return out


def _max_diff(a, b) -> float:
    diffs = [(x - y).abs().max().item() for x, y in zip(a, b)]
    return max(diffs) if diffs else float("inf")


def measure_ddp(MyDDP, rank: int, cap_mb: float = common.CAP_MB, steps: int = common.STEPS) -> dict:
    """MyDDP and PyTorch's DDP side by side on ``LabNet``, same weights, cap and data; then one
    more backward of MyDDP alone in which every rank but 0 starts ``LATE_S`` late
    (``late_backward``)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = launch.device()
    out: dict = {}
    torch_model, my_model = common.build_model(0).to(dev), common.build_model(0).to(dev)
    state = {"log": None, "seen": [], "bytes": [], "ready": 0}

    def ready(p):  # what this step had all-reduced when this gradient was ready
        log = state["log"]
        issued = [r.nbytes for r in log.records if r.collective == "all_reduce"] if log else []
        state["seen"].append(len(issued))
        # (bytes all-reduced so far, bytes of the gradients ready BEFORE this one)
        state["bytes"].append((sum(issued), state["ready"]))
        state["ready"] += p.numel() * p.element_size()

    for p in my_model.parameters():  # registered before MyDDP's hooks, hence run before them
        p.register_post_accumulate_grad_hook(ready)
    ids = [dev.index] if dev.type == "cuda" else None
    ddp = DDP(torch_model, device_ids=ids, bucket_cap_mb=cap_mb)
    mine = MyDDP(my_model, bucket_cap_mb=cap_mb)
    opts = [torch.optim.SGD(m.parameters(), lr=common.LR) for m in (torch_model, my_model)]
    out["my_sizes"], out["ddp_sizes"], out["seen"], out["ready_bytes"] = [], [], [], []
    for step in range(steps):
        x, y = common.batch(rank, step, dev)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        with CommLog() as log:
            F.mse_loss(ddp(x), y).backward()
        out["ddp_sizes"].append([r.nbytes for r in log.records if r.collective == "all_reduce"])
        state.update(seen=[], bytes=[], ready=0)
        with CommLog() as log:
            state["log"] = log
            F.mse_loss(mine(x), y).backward()
            state["log"] = None
            mine.finish_gradient_synchronization()
        out["my_sizes"].append([r.nbytes for r in log.records if r.collective == "all_reduce"])
        out["seen"].append(state["seen"])
        out["ready_bytes"].append(state["bytes"])
        if step == 0:
            grads = [p.grad for p in my_model.parameters()]
            ref = [p.grad for p in torch_model.parameters()]
            out["grad_diff"] = (float("inf") if any(g is None for g in grads) else
                                _max_diff(ref, grads))
            if out["grad_diff"] != float("inf"):  # <mine, ref> / <ref, ref>: N if not divided
                out["grad_ratio"] = (sum((g * r).sum().item() for g, r in zip(grads, ref)) /
                                     max(sum((r * r).sum().item() for r in ref), 1e-30))
        for opt in opts:
            opt.step()
    out["weight_diff"] = _max_diff(list(torch_model.parameters()), list(my_model.parameters()))
    state.update(seen=[], bytes=[], ready=0)  # the lists above are out's now
    out["late_backward_s"] = late_backward(mine, my_model, rank, dev)
    return out


def late_backward(mine, model, rank: int, dev, late_s: float = None) -> float:
    """Seconds rank 0's ``backward()`` takes (on a GPU until its compute stream has done the
    work it queued) while every other rank starts its backward ``late_s`` later. An AllReduce
    that is only issued goes on without the late peers; a hook that waits for one (a blocking
    ``dist.all_reduce``, or ``work.wait()``) holds rank 0's backward until they arrive."""
    import time

    late_s = LATE_S if late_s is None else late_s
    x, y = common.batch(rank, common.STEPS, dev)
    model.zero_grad(set_to_none=True)
    loss = F.mse_loss(mine(x), y)
    dist.barrier()
    if rank != 0:
        time.sleep(late_s)
    start = time.perf_counter()
    loss.backward()
    if dev.type == "cuda":  # NCCL: a blocking all_reduce makes the compute stream wait
        torch.cuda.current_stream(dev).synchronize()
    took = time.perf_counter() - start
    mine.finish_gradient_synchronization()
    return took


def _flat_state(model) -> tuple[torch.Tensor, torch.Tensor]:
    params = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    return params, torch.cat([b.reshape(-1).cpu() for b in model.buffers()])


def measure_broadcast(MyDDP, rank: int) -> dict:
    """Each rank builds LabNet from its own seed and wraps it: what is left of the difference."""
    model = common.build_model(100 + rank).to(launch.device())
    before = _flat_state(model)
    MyDDP(model, bucket_cap_mb=common.CAP_MB)
    return {"before": before, "after": _flat_state(model)}


def measure(rank: int, world_size: int, paths: list[str], ring_only: bool = False,
            progress: str | None = None) -> list[dict]:
    """Rank function for ``launch.spawn``: per file, what ``judge`` needs (only the ring's
    rows if ``ring_only``). Each part catches the learner's exception (every rank runs the same
    code, so they fail together) and goes on. Rank 0 appends the index of each file it starts
    to the file ``progress``: when the launch hangs, the caller knows on which file."""
    reports = []
    for index, path in enumerate(paths):
        if progress and rank == 0:
            with open(progress, "a", encoding="utf-8") as f:
                f.write(f"{index}\n")
        rep: dict = {"rank": rank}
        try:
            mod = load(path)
            missing = [n for n in NAMES if not hasattr(mod, n)]
            rep["load"] = f"thiếu {', '.join(missing)}" if missing else None
        except Exception as exc:  # noqa: BLE001
            rep["load"] = _error(exc)
        if rep["load"] is None:
            rep["ring"] = measure_ring(mod.ring_all_reduce, rank)
            for key, fn in (() if ring_only else
                            (("ddp", measure_ddp), ("broadcast", measure_broadcast))):
                try:
                    rep[key] = fn(mod.MyDDP, rank)
                except Exception as exc:  # noqa: BLE001
                    rep[key] = {"error": _error(exc)}
            dist.barrier()
        reports.append(rep)
    return reports


# ------------------------------------------------------------------------------- in the parent

def expected_buckets(cap_mb: float = common.CAP_MB) -> list[buckets.Bucket]:
    """The buckets PyTorch's DDP uses for ``LabNet`` with this cap once it has rebuilt them
    (from step 2 on): packed in gradient-ready order, ``dpbook.buckets``."""
    model = common.build_model(0)
    setting = buckets.DdpSetting(bucket_cap_mb=cap_mb)
    order = buckets.ready_order(model, common.batch(0, 0)[0])
    return buckets.rebuilt_buckets(buckets.model_params(model), setting, order)


def judge_load(reports: list[dict]) -> Item:
    error = reports[0]["load"]
    return Item("load", "Nạp được file, có ring_all_reduce và MyDDP", error is None,
                error or "", _LOAD_HINT)


def _skipped(key: str, title: str, why: str) -> Item:
    return Item(key, title, False, f"không chạy được: {why}")


RING_TITLE = "ring_all_reduce cộng đúng như dist.all_reduce, mọi kích thước"
RING_BYTES_TITLE = "Mỗi rank gửi 2(N − 1)/N số byte của tensor, mỗi lần một đoạn"


def judge_ring(reports: list[dict], world: int) -> Item:
    """Values equal ``dist.all_reduce`` on every shape, with send/recv only."""
    title = RING_TITLE
    hint = ("chia tensor phẳng thành N đoạn bằng tensor_split (đoạn đầu dài hơn một phần tử khi "
            "N không chia hết); cộng tại chỗ vào các view của tensor, đừng trả về tensor mới.")
    for row in zip(*(r["ring"] for r in reports)):
        shape = "×".join(map(str, row[0]["shape"]))
        if any("error" in r for r in row):
            err = next(r["error"] for r in row if "error" in r)
            return Item("ring", title, False, f"kích thước {shape}: {err}", hint)
        others = sorted({c for r in row for c in r["others"]})
        if others:
            return Item("ring", title, False, f"kích thước {shape}: gọi {', '.join(others)}",
                        "chỉ dùng dist.send/recv/isend/irecv; không gọi phép toán tập thể.")
        worst = max(r["diff"] for r in row)
        if worst > RING_TOL:
            return Item("ring", title, False, f"kích thước {shape} ({vi.grouped(row[0]['numel'])} "
                        f"phần tử): sai khác tương đối {vi.sci(worst, 1)}", hint)
    shapes = ", ".join("×".join(map(str, r["shape"])) for r in reports[0]["ring"])
    return Item("ring", title, True, f"{len(reports[0]['ring'])} kích thước ({shapes}), N = {world}")


def judge_ring_bytes(reports: list[dict], world: int) -> Item:
    """Each rank sends 2 (N-1)/N of the bytes: exactly when N divides the size; for any size
    the ranks together send 2 (N-1) times the bytes and each at most 2 (N-1) chunks of ceil."""
    title = RING_BYTES_TITLE
    hint = ("mỗi bước mỗi rank gửi đúng MỘT đoạn (1/N tensor) cho rank bên phải: N − 1 bước "
            "ReduceScatter rồi N − 1 bước AllGather; đừng gửi cả tensor.")
    rows = list(zip(*(r["ring"] for r in reports)))
    if not rows or any("error" in r for row in rows for r in row):
        return _skipped("ring_bytes", title, "ring_all_reduce chưa chạy xong mọi kích thước")
    for row in rows:
        n, nbytes = row[0]["numel"], row[0]["nbytes"]
        elem = nbytes // max(n, 1)
        sent = [r["sent"] for r in row]
        shape = "×".join(map(str, row[0]["shape"]))
        chunk = -(-n // world) * elem  # the longest of tensor_split's N chunks
        too_big = max((m for r in row for m in r.get("messages", ())), default=0)
        if too_big > chunk:
            return Item("ring_bytes", title, False, f"kích thước {shape} ({vi.grouped(nbytes)} "
                        f"byte): một lần gửi {vi.grouped(too_big)} byte, mỗi đoạn chỉ tối đa "
                        f"{vi.grouped(chunk)} byte (1/N tensor); các rank gửi tổng "
                        f"{', '.join(vi.grouped(s) for s in sent)} byte", hint)
        ok = sum(sent) == 2 * (world - 1) * nbytes and all(
            s <= 2 * (world - 1) * chunk for s in sent)
        if n % world == 0:
            ok = ok and all(s == 2 * (world - 1) * nbytes // world for s in sent)
        if not ok:
            want = (f"{vi.grouped(2 * (world - 1) * nbytes // world)} mỗi rank"
                    if n % world == 0 or world == 2 else
                    f"tổng {vi.grouped(2 * (world - 1) * nbytes)} trên các rank")
            if sum(sent) < 2 * (world - 1) * nbytes:
                hint = ("có phần tử không được gửi đi: N đoạn phải phủ TOÀN BỘ tensor, kể cả "
                        "phần dư khi N không chia hết kích thước (tensor_split).")
            return Item("ring_bytes", title, False, f"kích thước {shape} ({vi.grouped(nbytes)} "
                        f"byte): các rank gửi {', '.join(vi.grouped(s) for s in sent)} byte, "
                        f"mong đợi {want}", hint)
    big = rows[-1]
    return Item("ring_bytes", title, True, f"{vi.grouped(big[0]['nbytes'])} byte: mỗi rank gửi "
                f"{', '.join(vi.grouped(r['sent']) for r in big)} byte")


def ring_items(runs: dict) -> tuple[Item, Item]:
    """The two ring items over every N of ``runs`` (``{N: per-rank reports}``, or ``{N:
    failed Result}`` when that launch did not finish): the first N that fails names itself."""
    found = {"ring": None, "ring_bytes": None}
    for world in sorted(runs):
        run = runs[world]
        if isinstance(run, Result):  # the launch itself failed (hang, crash)
            launch_item = run.items[0]
            for key, title in (("ring", RING_TITLE), ("ring_bytes", RING_BYTES_TITLE)):
                found[key] = found[key] or Item(key, title, False,
                                                f"N = {world}: {launch_item.detail}",
                                                launch_item.hint)
            continue
        for key, item in (("ring", judge_ring(run, world)),
                          ("ring_bytes", judge_ring_bytes(run, world))):
            if not item.passed and found[key] is None:
                found[key] = Item(key, item.title, False, f"N = {world}: {item.detail}",
                                  item.hint)
    worlds = ", ".join(map(str, sorted(runs)))
    first = runs[min(runs)]
    out = []
    for key, judge_one in (("ring", judge_ring), ("ring_bytes", judge_ring_bytes)):
        if found[key] is None:
            item = judge_one(first, min(runs))
            found[key] = Item(key, item.title, True, f"N = {worlds}; N = {min(runs)}: "
                              f"{item.detail.removesuffix(f', N = {min(runs)}')}")
        out.append(found[key])
    return tuple(out)


def premature_bucket(reports: list[dict]) -> str | None:
    """When some AllReduce carried more bytes than the gradients ready before it: the step,
    the gradient and the bytes, else ``None``."""
    for step, events in enumerate(reports[0]["ddp"].get("ready_bytes", []), 1):
        for k, (issued, ready) in enumerate(events):
            if issued > ready:
                return (f"bước {step}: khi gradient thứ {k + 1}/{len(events)} sẵn sàng, đã thực "
                        f"hiện AllReduce trên {vi.grouped(issued)} byte nhưng mới "
                        f"{vi.grouped(ready)} byte gradient sẵn sàng")
    return None


_PREMATURE_HINT = ("một bucket được gửi trước khi mọi gradient của nó sẵn sàng: chỉ thêm tham "
                   "số vào bucket trong hook của chính nó (register_post_accumulate_grad_hook, "
                   "khi p.grad đã có giá trị của lượt này), và chỉ phát bucket khi nó đã nhận đủ.")


def judge_grads(reports: list[dict]) -> Item:
    title = "Gradient sau một bước bằng gradient của DistributedDataParallel"
    if "error" in reports[0]["ddp"]:
        return Item("grads", title, False, reports[0]["ddp"]["error"],
                    "đọc thông báo lỗi; lỗi xảy ra khi dựng MyDDP hoặc trong bước huấn luyện.")
    world = len(reports)
    diff = max(r["ddp"]["grad_diff"] for r in reports)
    ratio = reports[0]["ddp"].get("grad_ratio")
    detail = f"sai khác lớn nhất {vi.sci(diff, 1)} (ngưỡng {vi.sci(GRAD_TOL, 0)})"
    if premature_bucket(reports):
        hint = f"hệ quả của mục bucket: {_PREMATURE_HINT}"
    elif ratio is not None and abs(ratio - world) < 0.01 * world:
        detail += f"; gradient của bạn gấp {vi.number(ratio, 3)} lần của DDP"
        hint = (f"gradient gấp N = {world} lần: đó là TỔNG trên các rank, chưa chia cho world "
                "size. Chia bucket cho N (trước hoặc sau AllReduce) để được trung bình.")
    else:
        hint = ("sau finish_gradient_synchronization(), mỗi .grad phải là TRUNG BÌNH trên các "
                "rank: chia tổng cho world size; chép đúng đoạn của bucket về đúng tham số.")
    return Item("grads", title, diff <= GRAD_TOL, detail, hint)


def judge_weights(reports: list[dict], steps: int = common.STEPS) -> Item:
    title = f"Trọng số sau {steps} bước SGD bằng trọng số của DistributedDataParallel"
    if "error" in reports[0]["ddp"]:
        return _skipped("weights", title, "MyDDP lỗi (xem mục trên)")
    diff = max(r["ddp"]["weight_diff"] for r in reports)
    grads = judge_grads(reports)
    hint = (grads.hint if grads.hint.startswith("hệ quả") else
            f"hệ quả của mục gradient: {grads.hint}" if not grads.passed else
            "mỗi bước phải chờ mọi bucket rồi mới optimizer.step(); bucket nào cũng phải được "
            "gửi, kể cả bucket cuối chưa đầy.")
    return Item("weights", title, diff <= GRAD_TOL, f"sai khác lớn nhất {vi.sci(diff, 1)}", hint)


def judge_buckets(reports: list[dict], expected: list[buckets.Bucket], cap_bytes: int,
                  largest: int) -> Item:
    """Per step as many AllReduces as DDP's buckets for this cap, none above cap + one tensor,
    together every gradient once, and none carrying a gradient that was not ready yet."""
    title = "Mỗi bước số AllReduce bằng số bucket của DDP, không bucket nào vượt giới hạn"
    if "error" in reports[0]["ddp"]:
        return _skipped("buckets", title, "MyDDP lỗi (xem mục trên)")
    hint = ("gom gradient theo thứ tự chúng sẵn sàng; đóng bucket ngay khi số byte của nó >= "
            "bucket_cap_mb × 1024 × 1024 (gradient làm vượt ở lại trong bucket), phát mỗi bucket "
            "bằng dist.all_reduce(flat, async_op=True).")
    want, total = len(expected), sum(b.nbytes for b in expected)
    early = premature_bucket(reports)
    if early:
        return Item("buckets", title, False, early, _PREMATURE_HINT)
    for step, sizes in enumerate(reports[0]["ddp"]["my_sizes"], 1):
        seen = (f"bước {step}: {len(sizes)} AllReduce "
                f"({', '.join(vi.grouped(s) for s in sizes)} byte), DDP dùng {want} bucket")
        if len(sizes) != want or sum(sizes) != total or max(sizes) > cap_bytes + largest:
            return Item("buckets", title, False, seen, hint)
    return Item("buckets", title, True, f"{want} AllReduce mỗi bước, lớn nhất "
                f"{vi.grouped(max(reports[0]['ddp']['my_sizes'][0]))} byte ≤ giới hạn "
                f"{vi.grouped(cap_bytes)} + tensor lớn nhất {vi.grouped(largest)} byte")


def judge_overlap(reports: list[dict], late_s: float = LATE_S) -> Item:
    """The first AllReduce of every step is issued before the last gradient is ready, and
    rank 0's backward does not wait for it: with the other ranks ``late_s`` late, it still
    ends in well under ``late_s / 2``."""
    title = "AllReduce của bucket đầu được phát trong lúc backward còn chạy, không chờ nó xong"
    if "error" in reports[0]["ddp"]:
        return _skipped("overlap", title, "MyDDP lỗi (xem mục trên)")
    hint = ("phát mỗi bucket ngay trong hook, khi nó vừa đầy, bằng dist.all_reduce(..., "
            "async_op=True); chỉ chờ (work.wait()) trong finish_gradient_synchronization().")
    for step, seen in enumerate(reports[0]["ddp"]["seen"], 1):
        if not seen:
            return Item("overlap", title, False, f"bước {step}: không hook nào chạy", hint)
        if seen[-1] == 0:
            return Item("overlap", title, False, f"bước {step}: chưa có AllReduce nào được phát khi "
                        f"gradient cuối cùng ({len(seen)}/{len(seen)}) sẵn sàng", hint)
    seen = reports[0]["ddp"]["seen"][0]
    first = next(i for i, n in enumerate(seen) if n > 0)
    took = reports[0]["ddp"].get("late_backward_s")
    if took is not None and took >= late_s / 2:
        return Item("overlap", title, False, f"các rank khác bắt đầu lượt truyền ngược muộn "
                    f"{vi.number(late_s * 1000, 0)} ms: backward() của rank 0 mất "
                    f"{vi.number(took * 1000, 0)} ms, tức hook đã chờ AllReduce xong",
                    "hook không được chờ: dist.all_reduce(flat) không có async_op=True, hay "
                    "work.wait() ngay trong hook, chặn lượt truyền ngược tới khi mọi rank gửi "
                    "xong bucket. Dùng async_op=True, giữ work và chỉ chờ trong "
                    "finish_gradient_synchronization().")
    late = ("" if took is None else f"; backward() của rank 0 xong sau "
            f"{vi.number(took * 1000, 0)} ms dù các rank khác muộn {vi.number(late_s * 1000, 0)} ms")
    return Item("overlap", title, True, f"AllReduce đầu tiên phát khi mới {first}/{len(seen)} "
                f"gradient sẵn sàng{late}")


def judge_broadcast(reports: list[dict]) -> Item:
    title = "Các rank khởi tạo với seed khác nhau vẫn bằng nhau sau khi dựng MyDDP"
    hint = ("trong __init__, dist.broadcast(t, src=0) mọi tham số VÀ buffer "
            "(module.buffers()) trong torch.no_grad().")
    if any("error" in r["broadcast"] for r in reports):
        return Item("broadcast", title, False, reports[0]["broadcast"]["error"], hint)
    (p0, b0), rest = reports[0]["broadcast"]["before"], reports[1:]
    p_diff = max(_max_diff([p0], [r["broadcast"]["after"][0]]) for r in reports)
    b_diff = max(_max_diff([b0], [r["broadcast"]["after"][1]]) for r in reports)
    spread = max(_max_diff([p0], [r["broadcast"]["before"][0]]) for r in rest)
    ok = p_diff == 0 and b_diff == 0 and spread > 0
    return Item("broadcast", title, ok, f"trước khi dựng các rank lệch nhau tới "
                f"{vi.number(spread, 3)}; sau khi dựng, lệch so với rank 0: tham số "
                f"{vi.general(p_diff)}, buffer {vi.general(b_diff)}", hint)


def judge(path: str, reports: list[dict], cap_mb: float = common.CAP_MB,
          ring_runs: dict | None = None) -> Result:
    """The items of one file from what its ranks measured; ``ring_runs`` (``{N: per-rank
    reports or a failed Result}``): the ring measured at other N as well."""
    world = len(reports)
    items = [judge_load(reports)]
    if items[0].passed:
        expected = expected_buckets(cap_mb)
        largest = max(p.numel() for p in common.build_model(0).parameters()) * 4
        items += [*ring_items({**(ring_runs or {}), world: reports}),
                  judge_grads(reports), judge_weights(reports),
                  judge_buckets(reports, expected, int(cap_mb * 1024 * 1024), largest),
                  judge_overlap(reports), judge_broadcast(reports)]
    return Result(str(path), world, tuple(items), tuple(reports))


def failed_launch(path: str, world: int, exc: BaseException) -> Result:
    """Every rank had to be stopped: one item that says why."""
    if isinstance(exc, TimeoutError):
        detail, hint = "quá thời gian, đã dừng mọi process", (
            "các rank đang chờ nhau: send/recv không thành cặp (mỗi bước mỗi rank gửi sang phải "
            "và nhận từ trái), hoặc một rank bỏ qua một phép toán tập thể mà rank kia gọi.")
    else:
        detail, hint = str(exc).strip().splitlines()[-1][:300], "đọc lỗi ở trên."
    return Result(str(path), world, (Item("launch", "Chạy xong trên mọi rank", False, detail,
                                          hint),))


def _launch(paths: list[str], world: int, timeout: float, backend: str,
            ring_only: bool = False) -> list:
    """Per file of ``paths``, its per-rank reports, or the failed ``Result`` that says why
    there are none. All files go in one launch; if it hangs or crashes, the file it was on
    gets the failed ``Result`` and the files before and after it are launched again without
    it (review G7: one hanging file no longer fails the others; it costs one ``timeout``)."""
    import tempfile

    if not paths:
        return []
    with tempfile.TemporaryDirectory(prefix="lab-d-") as folder:
        progress = os.path.join(folder, "progress")
        try:
            per_rank = launch.spawn(measure, paths, ring_only, progress, world_size=world,
                                    backend=backend, timeout=timeout, output="none")
            return [[r[i] for r in per_rank] for i in range(len(paths))]
        except (launch.RankError, TimeoutError) as exc:
            try:
                with open(progress, encoding="utf-8") as f:
                    stuck = int(f.read().split()[-1])
            except (OSError, IndexError, ValueError):  # no file started: blame the first
                stuck = 0
            failed = failed_launch(paths[stuck], world, exc)
    return [*_launch(paths[:stuck], world, timeout, backend, ring_only), failed,
            *_launch(paths[stuck + 1:], world, timeout, backend, ring_only)]


def check_files(paths, world_size: int = 2, timeout: float = 120.0, verbose: bool = True,
                backend: str = "auto") -> list[Result]:
    """Judge several files in one launch of ``world_size`` ranks (a file that hangs costs only
    its own result, ``_launch``), then their rings alone in one launch for each other N of
    ``RING_WORLDS``; print each report if ``verbose``."""
    paths = [str(preflight.source(p)) for p in paths]
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size phải là số nguyên >= 2 (một vòng cần ít nhất hai rank), "
                         f"nhận được {world_size!r}.")
    main = dict(zip(paths, _launch(paths, world_size, timeout, backend)))
    loaded = [p for p in paths if not isinstance(main[p], Result) and main[p][0]["load"] is None]
    rings = {p: {} for p in loaded}
    for n in RING_WORLDS:
        if n == world_size or not loaded:
            continue
        try:  # backend="nccl" with fewer GPUs than n: the ring runs on gloo
            launch.plan(n, backend)
            ring_backend = backend
        except ValueError:
            ring_backend = "auto"
        for p, run in zip(loaded, _launch(loaded, n, timeout, ring_backend, ring_only=True)):
            rings[p][n] = run
    results = [main[p] if isinstance(main[p], Result) else
               judge(p, main[p], ring_runs=rings.get(p)) for p in paths]
    if verbose:
        for r in results:
            print(r)
    return results


def check(path: str | os.PathLike, world_size: int = 2, timeout: float = 120.0,
          verbose: bool = True, backend: str = "auto") -> Result:
    """Run the file ``path`` on ``world_size`` ranks (NCCL with a GPU each, else gloo), judge
    it, print the report if ``verbose``, return the ``Result``."""
    return check_files([path], world_size, timeout, verbose, backend)[0]


def main(argv=None) -> int:
    """``python -m dpbook.labs.lab_d.checker FILE [--nproc N] [--timeout S]``."""
    return report.command_line(
        argv, "lab_d", "Chấm Bài D: chạy ring_all_reduce và MyDDP của bạn trên nhiều rank, so "
        "với PyTorch.", "đường dẫn tới file .py của bạn", check, 120.0, min_nproc=2)


if __name__ == "__main__":
    raise SystemExit(main())
