"""Bucket xếp sẵn theo thứ tự đăng ký tham số và được phát khi tham số đăng ký cuối của nó sẵn sàng, lúc các gradient khác của nó chưa có (lấy số 0 thay); mục buckets phải bắt (gửi trước khi gradient sẵn sàng), grads/weights là hệ quả."""

import torch
import torch.distributed as dist

from dpbook.labs.lab_d import solution
from dpbook.labs.lab_d.solution import ring_all_reduce

__all__ = ["ring_all_reduce", "MyDDP"]


class MyDDP(solution.MyDDP):
    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__(module, bucket_cap_mb)
        # SAI: bucket theo thứ tự module.parameters(), không theo thứ tự sẵn sàng
        self.plan, current, size = [], [], 0
        for p in self.params:
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= self.cap_bytes:
                self.plan.append(current)
                current, size = [], 0
        if current:
            self.plan.append(current)
        self.sent = set()

    def _grad_ready(self, p):
        for i, bucket in enumerate(self.plan):
            if bucket[-1] is p and i not in self.sent:
                self.sent.add(i)
                flat = torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q))
                                  .reshape(-1) for q in bucket]) / self.world_size
                work = dist.all_reduce(flat, async_op=True)
                self.pending.append(solution.PendingBucket(bucket, flat, work))

    def finish_gradient_synchronization(self):
        for i, bucket in enumerate(self.plan):  # buckets whose last parameter never came
            if i not in self.sent:
                self._grad_ready(bucket[-1])
        for b in self.pending:
            b.work.wait()
            offset = 0
            for q in b.params:
                n = q.numel()
                if q.grad is None:
                    q.grad = torch.zeros_like(q)
                q.grad.copy_(b.flat[offset:offset + n].view_as(q))
                offset += n
        self.pending, self.sent = [], set()
