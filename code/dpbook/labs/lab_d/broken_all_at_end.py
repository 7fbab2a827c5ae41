"""Bài D, bản cố tình sai: một DDP thực hiện AllReduce trên mọi gradient một lần, sau backward.

Gradient nó để lại vẫn đúng (trung bình trên các rank), nhưng mỗi bước chỉ có một AllReduce thay
vì một AllReduce cho mỗi bucket, và nó chỉ bắt đầu khi backward đã xong: không có gì chồng lấp.
``ring_all_reduce`` lấy từ lời giải mẫu.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dpbook.labs.lab_d.solution import ring_all_reduce

__all__ = ["ring_all_reduce", "MyDDP"]  # what the learner's file defines


class MyDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        # MISTAKE: no hooks, no buckets: one AllReduce of everything once backward has returned.
        params = [p for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params]) / dist.get_world_size()
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
