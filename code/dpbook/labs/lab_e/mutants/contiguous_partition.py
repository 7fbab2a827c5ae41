"""ShardedOptimizer chia tham số thành các đoạn liên tiếp theo thứ tự (không theo kích thước): trọng số đúng, tổng trạng thái đúng, nhưng rank nặng nhất giữ nhiều hơn cách chia tham lam (review G6); mục zero1_state phải bắt."""

__all__ = ["ShardedOptimizer", "fully_shard_scratch"]

import torch.distributed as dist

from dpbook.labs.lab_e import solution
from dpbook.labs.lab_e.solution import fully_shard_scratch


def contiguous_owners(params, world_size):
    """SAI: rank r nhận các tham số liên tiếp cho đến khi đủ tổng/N phần tử."""
    total, owner, acc = sum(p.numel() for p in params), [], 0
    for p in params:
        owner.append(min(acc * world_size // total, world_size - 1))
        acc += p.numel()
    return owner


class ShardedOptimizer(solution.ShardedOptimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        super().__init__(params, optimizer_cls, **kwargs)
        self.owner = contiguous_owners(params, dist.get_world_size())
        mine = [p for p, r in zip(params, self.owner) if r == dist.get_rank()]
        self.local = optimizer_cls(mine, **kwargs) if mine else None
        self.state = self.local.state if self.local else {}
