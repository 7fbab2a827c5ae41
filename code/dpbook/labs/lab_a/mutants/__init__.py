"""Wrong conversions of lab A ("mutants"), one mistake each: the checker must fail each on the
items of ``MUTANTS[name].items`` (exactly those), with ``hint`` in the hint of the first one.

Each is a one-line slip in the reference (``Edit``), whose ``why`` says what is wrong and which
item must catch it; ``tests/labs/test_mutants.py`` writes each out and runs the checker on it
(``broken_*.py`` of the lab are included).
Not caught, by design (the lab page says so): a script that saves the checkpoint on every rank
(the same bytes, written twice) or whose log shows rank 0's share of the loss.
"""

from __future__ import annotations

from pathlib import Path

from ...mutant import Edit, Mutant

HERE = Path(__file__).resolve().parent
LAB = HERE.parent
REFERENCE = LAB / "solution_ddp.py"


LOG_LINE = 'print(f"epoch {epoch}: loss = {total / len(loader):.6f}")'  # the reference's log line


def slip(old: str, new: str, why: str) -> Edit:
    return Edit(REFERENCE, old, new, why)


MUTANTS = {
    "no_sampler": Mutant(LAB / "broken_no_sampler.py", ("split", "weights", "loss"),
                         "DistributedSampler"),
    "module_prefix": Mutant(LAB / "broken_module_prefix.py", ("checkpoint",), "model.module.state_dict()"),
    "no_set_epoch": Mutant(slip(
        "            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n",
        "            # SAI: thiếu sampler.set_epoch(epoch)\n",
        "Không gọi sampler.set_epoch(epoch): mọi epoch đọc cùng một thứ tự; mục `set_epoch` phải "
        "bắt, `weights` và `loss` là hệ quả (gợi ý nêu set_epoch)."),
        ("set_epoch", "weights", "loss"), "sampler.set_epoch(epoch)"),
    "log_every_rank": Mutant(slip(
        "            if rank == 0:  # rank 0's share of the data only (exercise: all ranks' mean)\n"
        "                " + LOG_LINE + "\n",
        "            " + LOG_LINE + "  # SAI: mọi rank in\n",
        "Mọi rank in dòng log `epoch E: ...` (thiếu `if rank == 0`): mục `log_once` phải bắt."),
        ("log_once",), "if rank == 0"),
    "full_batch_per_rank": Mutant(slip(
        "batch_size=BATCH_SIZE // world_size, sampler=sampler)",
        "batch_size=BATCH_SIZE, sampler=sampler)  # SAI",
        "Mỗi rank dùng batch BATCH_SIZE thay vì BATCH_SIZE // world_size (batch toàn cục gấp N): dữ "
        "liệu chia đúng nhưng trọng số khác; mục `weights` phải bắt (gợi ý nêu BATCH_SIZE // "
        "world_size), `loss` là hệ quả."),
        ("weights", "loss"), "BATCH_SIZE // world_size"),
    "loss_on_shard": Mutant(slip(
        "            final = evaluate(model.module, dataset)\n",
        "            final = total / len(loader)  # SAI: giá trị mất mát huấn luyện của riêng rank 0\n",
        "Giá trị mất mát lưu trong checkpoint là giá trị mất mát huấn luyện của riêng rank 0 ở epoch "
        "cuối, không phải evaluate trên toàn bộ tập dữ liệu: trọng số đúng; mục `loss` phải bắt (gợi "
        "ý nêu evaluate(model.module, dataset))."),
        ("loss",), "evaluate(model.module, dataset)"),
}
