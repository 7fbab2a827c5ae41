"""Bài E, bản cố tình sai: gradient đi bằng AllReduce rồi mới cắt lấy shard.

Kết quả đúng (phần của rank này trong tổng vẫn là tổng của phần ấy), nhưng mỗi rank nhận cả
gradient đầy đủ đã cộng, rồi bỏ đi N−1 phần: AllReduce gửi 2(N−1)/N kích thước thay vì
(N−1)/N của ReduceScatter. ``ShardedOptimizer`` là của lời giải mẫu.
"""

__all__ = ["AllReduceUnit", "ShardedOptimizer", "fully_shard_scratch"]

import torch.distributed as dist

from dpbook.labs.lab_e import solution
from dpbook.labs.lab_e.solution import ShardedOptimizer


class AllReduceUnit(solution.ShardedUnit):
    def reduce_grad(self, i, full_grad):
        if full_grad is None:
            return None
        s = self.shards[i].numel()
        flat = full_grad.new_zeros(self.n * s)
        flat[:full_grad.numel()] = full_grad.flatten()
        dist.all_reduce(flat)  # LỖI: mọi rank nhận tổng của cả tensor
        return flat[self.rank * s:(self.rank + 1) * s] / self.n


def fully_shard_scratch(model, units):
    for unit in solution.check_units(model, units):
        AllReduceUnit(unit)
