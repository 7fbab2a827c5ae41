"""Bài E, bản cố tình sai: ``fully_shard_scratch`` không giải phóng tham số đã gom sau lượt xuôi.

Khối vẫn xóa tham số đầy đủ khỏi module sau khi tính, nhưng không đặt ``saved_tensors_hooks``:
autograd giữ lại chính các tensor đầy đủ (để tính gradient theo đầu vào của tầng Linear) cho
đến lượt ngược. Bộ nhớ không được trả lại, và lượt ngược không cần gom lại nữa: đó là cách làm
của SHARD_GRAD_OP (ZeRO-2), không phải FULL_SHARD. ``ShardedOptimizer`` là của lời giải mẫu.
"""

__all__ = ["KeepFullUnit", "ShardedOptimizer", "fully_shard_scratch"]

import contextlib

from dpbook.labs.lab_e import solution
from dpbook.labs.lab_e.solution import ShardedOptimizer


class KeepFullUnit(solution.ShardedUnit):
    def __init__(self, module):
        super().__init__(module)
        self.saving = contextlib.nullcontext()  # LỖI: autograd giữ nguyên tham số đầy đủ

    def pre_backward(self, grad):
        pass  # tham số đầy đủ vẫn còn trong đồ thị autograd: không gom lại


def fully_shard_scratch(model, units):
    for unit in solution.check_units(model, units):
        KeepFullUnit(unit)
