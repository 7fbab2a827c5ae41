"""Wrong versions of lab D ("mutants"), one mistake each: the checker must fail each on the
items of ``MUTANTS[name].items`` (exactly those), with ``hint`` in the hint of the first one.

Each file's docstring says what is wrong and which item must catch it; ``tests/labs/
test_mutants.py`` runs the checker on all of them (``broken_*.py`` of the lab are included).
"""

from __future__ import annotations

from pathlib import Path

from ...mutant import Mutant

HERE = Path(__file__).resolve().parent
LAB = HERE.parent

MUTANTS = {
    "ring_divisible": Mutant(LAB / "broken_ring_divisible.py", ("ring", "ring_bytes"), "tensor_split"),
    "all_at_end": Mutant(LAB / "broken_all_at_end.py", ("buckets", "overlap"), "thứ tự chúng sẵn sàng"),
    "whole_tensor_ring": Mutant(HERE / "whole_tensor_ring.py", ("ring_bytes",), "đừng gửi cả tensor"),
    "blocking_hook": Mutant(HERE / "blocking_hook.py", ("overlap",), "async_op=True"),
    "wait_in_hook": Mutant(HERE / "wait_in_hook.py", ("overlap",), "work.wait() ngay trong hook"),
    "sum_not_divided": Mutant(HERE / "sum_not_divided.py", ("grads", "weights"), "chưa chia cho world size"),
    "bucket_before_ready": Mutant(HERE / "bucket_before_ready.py", ("grads", "weights", "buckets"),
                                  "trước khi mọi gradient của nó sẵn sàng"),
    "crossing_opens_bucket": Mutant(HERE / "crossing_opens_bucket.py", ("buckets",),
                                    "gradient làm vượt ở lại trong bucket"),
    "no_buffer_broadcast": Mutant(HERE / "no_buffer_broadcast.py", ("broadcast",), "buffer"),
}
# Hangs (every rank blocked in send): costs one checker timeout, so it is kept apart.
HANGING = Mutant(HERE / "blocking_send_ring.py", ("launch",), "send/recv không thành cặp")
