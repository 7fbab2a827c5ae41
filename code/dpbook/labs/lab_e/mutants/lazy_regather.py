"""HỢP LỆ (không phải lỗi): lượt ngược chỉ gom lại khi autograd thật sự cần tham số đầy đủ (unpack); khối 0, có đầu vào không cần gradient, không gom lại, ít byte AllGather ngược hơn công thức mà không giữ gì (review G5); bộ kiểm tra phải cho qua mọi mục."""

__all__ = ["LazyUnit", "ShardedOptimizer", "fully_shard_scratch"]

from dpbook.labs.lab_e import solution
from dpbook.labs.lab_e.solution import ShardedOptimizer


class LazyUnit(solution.ShardedUnit):
    def pre_backward(self, grad):
        pass  # unpack() gom lại lần đầu nó cần một tham số đầy đủ, và chỉ khi ấy


def fully_shard_scratch(model, units):
    for unit in solution.check_units(model, units):
        LazyUnit(unit)
