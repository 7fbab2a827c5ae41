"""Bài E, bản cố tình sai: ``ShardedOptimizer`` cập nhật *mọi* tham số trên *mọi* rank.

Trọng số vẫn đúng (mọi rank tính cùng một bước Adam, broadcast chỉ chép lại cùng giá trị), nhưng
mỗi rank giữ trạng thái Adam của cả mô hình: không còn gì được chia, bộ nhớ như DDP.
``fully_shard_scratch`` là của lời giải mẫu.
"""

__all__ = ["ShardedOptimizer", "fully_shard_scratch"]

import torch
import torch.distributed as dist

from dpbook.labs.lab_e.solution import fully_shard_scratch, owners


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        super().__init__(params, kwargs)
        self.owner = owners(params, dist.get_world_size())
        self.local = optimizer_cls(params, **kwargs)  # LỖI: mọi tham số, không chỉ của rank này
        self.state = self.local.state

    @torch.no_grad()
    def step(self, closure=None):
        self.local.step()
        for p, src in zip(self.param_groups[0]["params"], self.owner):
            dist.broadcast(p.data, src=src)
