"""Bản gom lại cho lượt ngược được gom ở mọi đơn vị và không bao giờ bỏ: tham số đầy đủ của mọi đơn vị nằm lại từ lượt ngược đến bước sau (review G3); mục fsdp_freed phải bắt (byte còn lại sau cả bước)."""

__all__ = ["KeepUnit", "ShardedOptimizer", "fully_shard_scratch"]

from dpbook.labs.lab_e import solution
from dpbook.labs.lab_e.solution import ShardedOptimizer


class KeepUnit(solution.ShardedUnit):
    def pre_backward(self, grad):
        self.bwd_buffers = self.kept = self.gather()  # SAI: self.kept giữ bản đầy đủ mãi


def fully_shard_scratch(model, units):
    for unit in solution.check_units(model, units):
        KeepUnit(unit)
