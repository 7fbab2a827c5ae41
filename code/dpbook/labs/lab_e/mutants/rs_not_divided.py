"""ReduceScatter cộng gradient nhưng quên chia cho N: gradient của shard là TỔNG trên các rank; Adam gần như không đổi khi gradient nhân hằng số nên trọng số vẫn gần đúng; mục fsdp_weights phải bắt (gradient của bước đầu, gấp N lần)."""

__all__ = ["SumUnit", "ShardedOptimizer", "fully_shard_scratch"]

import torch
import torch.distributed as dist

from dpbook.labs.lab_e import solution
from dpbook.labs.lab_e.solution import ShardedOptimizer


class SumUnit(solution.ShardedUnit):
    def reduce_grad(self, i, full_grad):
        if full_grad is None:
            return None
        shard = self.shards[i]
        flat = full_grad.new_zeros(self.n * shard.numel())
        flat[:full_grad.numel()] = full_grad.flatten()
        out = torch.empty_like(shard)
        dist.reduce_scatter_single(out, flat)
        return out  # SAI: thiếu / self.n


def fully_shard_scratch(model, units):
    for unit in solution.check_units(model, units):
        SumUnit(unit)
