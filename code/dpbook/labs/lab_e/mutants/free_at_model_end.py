"""Tham số đầy đủ của mỗi đơn vị chỉ được bỏ khi CẢ mô hình tính xong lượt xuôi (một hook trên module gốc), không ngay sau đơn vị của nó (review G4); mục fsdp_freed phải bắt (byte giữ lại khi đơn vị cuối bắt đầu)."""

__all__ = ["LateFreeUnit", "ShardedOptimizer", "fully_shard_scratch"]

from dpbook.labs.lab_e import solution
from dpbook.labs.lab_e.solution import ShardedOptimizer


class LateFreeUnit(solution.ShardedUnit):
    def post_forward(self, module, args, output):
        self.held = self.fulls  # SAI: còn giữ đến khi module gốc xong
        super().post_forward(module, args, output)


def fully_shard_scratch(model, units):
    wrapped = [LateFreeUnit(u) for u in solution.check_units(model, units)]

    def free_all(module, args, output):
        for unit in wrapped:
            unit.held = None

    model.register_forward_hook(free_all)
