"""Wrong versions of lab E ("mutants"), one mistake each: the checker must fail each on the
items of ``MUTANTS[name].items`` (exactly those), with ``hint`` in the hint of the first one.
``VALID`` are right versions that differ from the reference (the checker must pass them).

Each file's docstring says what is wrong and which item must catch it; ``tests/labs/
test_mutants.py`` runs the checker on all of them (``broken_*.py`` of the lab are included).
"""

from __future__ import annotations

from pathlib import Path

from ...mutant import Mutant

HERE = Path(__file__).resolve().parent
LAB = HERE.parent

MUTANTS = {
    "unsharded_state": Mutant(LAB / "broken_unsharded_state.py", ("zero1_state",),
                              "chỉ tạo bộ tối ưu bên trong cho các tham số nó sở hữu"),
    "never_free": Mutant(LAB / "broken_never_free.py", ("fsdp_bytes", "fsdp_freed"),
                         "SHARD_GRAD_OP"),
    "all_reduce": Mutant(LAB / "broken_all_reduce.py", ("fsdp_bytes",), "reduce_scatter_tensor"),
    "keep_bwd_buffers": Mutant(HERE / "keep_bwd_buffers.py", ("fsdp_freed",), "đừng giữ tới bước sau"),
    "free_at_model_end": Mutant(HERE / "free_at_model_end.py", ("fsdp_freed",),
                                "đừng đợi cả mô hình tính xong"),
    "contiguous_partition": Mutant(HERE / "contiguous_partition.py", ("zero1_state",),
                                   "không chia theo thứ tự tham số"),
    "rs_not_divided": Mutant(HERE / "rs_not_divided.py", ("fsdp_weights",), "phải chia cho N"),
}
VALID = {"lazy_regather": HERE / "lazy_regather.py"}
