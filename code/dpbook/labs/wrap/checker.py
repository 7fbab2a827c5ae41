"""Checker of the wrapping exercise: ``check(boc)`` runs the learner's ``boc`` on 2 ranks (the
backend ``launch.spawn`` picks) and prints, item by item, what holds and, for what does not, a
hint.

What it verifies, on each rank, for a ``TinyTransformer`` of ``DEPTH`` blocks:

1. ``boc(model)`` runs and returns the model (or ``None``, having changed it in place);
2. every ``TransformerBlock`` is an FSDP unit (``FSDPModule``);
3. the root is a unit, so every parameter is a ``DTensor`` shard (none stays whole);
4. there are ``DEPTH + 1`` units: blocks and root, no finer wrapping;
5. one forward pass issues one AllGather per unit (``measure.CommLog``), and the largest gathers
   no more than one block's parameters plus FSDP's padding, not the whole model;
6. after one backward pass the gradients (``full_tensor()``) equal an unsharded model's on the
   same global batch (each rank's loss is the mean over its own micro-batch, FSDP averages).

What it cannot see: whether the wrapping suits another model, mixed precision, or the memory a
real GPU would save (4.1.7 and Bài B measure that).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import launch, measure, vi
from ...models.transformer import TransformerBlock, build_tiny_transformer, random_tokens

DEPTH = 3
BATCH = 4
TOLERANCE = 1e-5

ITEMS = {
    "chay": "boc(model) chạy và trả về mô hình",
    "khoi": "mỗi khối TransformerBlock là một đơn vị FSDP",
    "goc": "gốc là một đơn vị: mọi tham số đều là shard (DTensor)",
    "so-don-vi": f"có đúng {DEPTH + 1} đơn vị: {DEPTH} khối và gốc",
    "allgather": "lượt truyền xuôi: mỗi đơn vị một AllGather, lần lớn nhất chỉ cỡ một khối",
    "gradient": "gradient bằng gradient của mô hình không chia mảnh trên cùng batch toàn cục",
}
HINTS = {
    "chay": "Đọc lỗi ở trên; hàm nhận model, gọi fully_shard, trả về model.",
    "khoi": "Gọi fully_shard(block) cho từng block trong model.blocks, trước khi bọc gốc.",
    "goc": "Sau các khối, gọi fully_shard(model): gốc giữ phần không thuộc khối nào "
           "(embedding, norm, head) và đồng bộ gradient của chúng.",
    "so-don-vi": "Mỗi khối một đơn vị, cộng gốc. Thừa: đừng bọc từng tầng Linear, mỗi đơn vị "
                 "thêm một AllGather và một ReduceScatter mỗi bước. Thiếu: xem hai mục trên.",
    "allgather": "Nếu một lần AllGather gom cả mô hình, bạn mới bọc gốc: các khối phải là "
                 "đơn vị riêng.",
    "gradient": "Tham số không nằm trong đơn vị nào thì gradient của nó không được đồng bộ "
                "giữa các rank: hãy bọc gốc.",
}


@dataclass
class Result:
    items: dict  # key -> (ok, detail)

    @property
    def passed(self) -> bool:
        return len(self.items) == len(ITEMS) and all(ok for ok, _ in self.items.values())

    @property
    def failed(self) -> list[str]:
        return [k for k, (ok, _) in self.items.items() if not ok]

    def __str__(self) -> str:
        lines = []
        for key, text in ITEMS.items():
            if key not in self.items:
                lines.append(f"– {text}: chưa kiểm tra được (hàm boc lỗi)")
                continue
            ok, detail = self.items[key]
            lines.append(f"{'✓' if ok else '✗'} {text}" + (f": {detail}" if detail else ""))
            if not ok:
                lines.append(f"    gợi ý: {HINTS[key]}")
        lines.append(f"Kết quả: {sum(ok for ok, _ in self.items.values())}/{len(ITEMS)} mục đạt.")
        return "\n".join(lines)


def _unit_bytes(module: torch.nn.Module, world_size: int) -> int:
    """A unit's parameters as FSDP gathers them: each padded on dim 0 to a multiple of N."""
    total = 0
    for p in module.parameters():
        rows = p.shape[0] if p.dim() else 1
        padded = -(-rows // world_size) * world_size
        total += padded * (p.numel() // max(rows, 1)) * p.element_size()
    return total


def _judge(rank: int, world_size: int, boc) -> dict:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    items = {}
    dev = launch.device()
    model = build_tiny_transformer(seed=0, depth=DEPTH).to(dev)
    reference = build_tiny_transformer(seed=0, depth=DEPTH).to(dev)
    block_bytes = max(_unit_bytes(b, world_size) for b in reference.blocks)
    try:
        out = boc(model)
        model = model if out is None else out
        items["chay"] = (isinstance(model, torch.nn.Module), "" if isinstance(
            model, torch.nn.Module) else f"boc trả về {type(out).__name__}, không phải mô hình")
    except Exception as exc:  # the learner's code: report it, do not crash the rank
        detail = f"{type(exc).__name__}: {exc}"
        if isinstance(model, FSDPModule) and not any(
                isinstance(b, FSDPModule) for b in model.blocks):
            detail += (" (gốc đã được bọc trước các khối: fully_shard phải đi từ dưới lên, "
                       "các khối trước, gốc sau)")
        items["chay"] = (False, detail)
        return items
    if not items["chay"][0]:
        return items
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    wrapped = sum(isinstance(b, FSDPModule) for b in blocks)
    items["khoi"] = (wrapped == len(blocks), f"{wrapped}/{len(blocks)} khối là đơn vị")
    whole = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    items["goc"] = (isinstance(model, FSDPModule) and not whole,
                    "" if not whole else f"{len(whole)} tham số không chia mảnh, ví dụ {whole[0]}")
    items["so-don-vi"] = (len(units) == DEPTH + 1, f"{len(units)} đơn vị" + (
        ", thiếu" if len(units) < DEPTH + 1 else ", thừa" if len(units) > DEPTH + 1 else ""))

    tokens = [random_tokens(BATCH, seed=r) for r in range(world_size)]
    x, y = (t.to(dev) for t in tokens[rank])
    with measure.CommLog() as log:
        logits = model(x)
    gathers = [r.nbytes for r in log.records if r.collective == "all_gather"]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    biggest = max(gathers, default=0)
    items["allgather"] = (len(gathers) == len(units) and 0 < biggest <= block_bytes * 1.01 + 4096,
                          f"{len(gathers)} lần AllGather cho {len(units)} đơn vị, lần lớn nhất "
                          f"{biggest} byte, một khối {block_bytes} byte")
    # the unsharded model on the global batch: the mean of the ranks' mean losses
    ref_loss = sum(torch.nn.functional.cross_entropy(
        reference(xi.to(dev)).flatten(0, 1), yi.to(dev).flatten()) for xi, yi in tokens)
    (ref_loss / world_size).backward()
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        worst = max(worst, float((g - q.grad).abs().max()) if g is not None else float("inf"))
    items["gradient"] = (worst <= TOLERANCE, f"sai khác lớn nhất {vi.sci(worst, 1)}")
    return items


def _judge_many(rank: int, world_size: int, *candidates) -> list[dict]:
    return [_judge(rank, world_size, boc) for boc in candidates]


def check_many(candidates, world_size: int = 2, timeout: float = 180.0) -> list[Result]:
    """Judge several ``boc`` functions in one launch (the tests' mutants)."""
    # one positional argument each: launch.spawn sends a function defined in a notebook by
    # value only when it sees it at the top level of the arguments
    per_rank = launch.spawn(_judge_many, *candidates, world_size=world_size,
                            timeout=timeout, output="none")
    results = []
    for i in range(len(candidates)):
        items = {}
        for rank_items in (r[i] for r in per_rank):
            for key, (ok, detail) in rank_items.items():
                prev = items.get(key, (True, detail))
                items[key] = (prev[0] and ok, detail if not ok else prev[1])
        results.append(Result(items))
    return results


def check(boc, world_size: int = 2, timeout: float = 180.0, verbose: bool = True) -> Result:
    """Run ``boc`` on ``world_size`` ranks and print the report (``verbose``)."""
    if not callable(boc):
        raise TypeError(f"check cần một hàm boc(model), không phải {type(boc).__name__}.")
    result = check_many([boc], world_size, timeout)[0]
    if verbose:
        print(result)
    return result
