"""Bài E: file khởi đầu. Sao chép file này (ví dụ thành ``my_zero.py``), viết hai phần dưới đây,
rồi chấm bằng ``python -m dpbook.labs.lab_e.checker my_zero.py`` (hoặc ``checker.check(...)``
trong một ô notebook). Mỗi hàm được gọi trên mọi rank, bên trong một process group đã khởi tạo.

Quy ước lưu shard (bộ kiểm tra dựa vào nó): tham số ``p`` có ``numel`` phần tử được duỗi phẳng,
đệm số 0 ở cuối cho đủ ``N * s`` phần tử với ``s = ceil(numel / N)``; rank ``r`` giữ đoạn
``[r*s, (r+1)*s)`` dưới dạng một ``nn.Parameter`` 1 chiều, đăng ký lại đúng tên cũ.
"""

import torch
from torch import nn


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``ShardedOptimizer(params, optimizer_cls, **kwargs)``.

    1. Chia các tham số cho các rank theo kích thước (tham số lớn nhất trước, cho rank đang
       nhẹ nhất), cùng một cách chia trên mọi rank.
    2. Tạo ``optimizer_cls`` chỉ cho các tham số của rank này; ``self.state`` là trạng thái của nó.
    3. ``step()``: cập nhật phần của mình, rồi mọi rank nhận mọi tham số đã cập nhật từ rank
       sở hữu nó (``dist.broadcast``).
    """

    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        super().__init__(params, kwargs)
        raise NotImplementedError("Bài E: hãy viết ShardedOptimizer.__init__.")

    def step(self, closure=None):
        raise NotImplementedError("Bài E: hãy viết ShardedOptimizer.step.")


def fully_shard_scratch(model: nn.Module, units: list[nn.Module]) -> None:
    """FSDP (ZeRO-3) tại chỗ.

    1. Thay mỗi tham số của mỗi đơn vị bằng shard của rank này (quy ước ở đầu file).
    2. Ngay trước khi một đơn vị tính lượt xuôi: AllGather các shard thành tham số đầy đủ và cho
       đơn vị dùng chúng; ngay sau đó: bỏ chúng, kể cả bản mà autograd giữ cho lượt ngược.
    3. Lượt ngược của đơn vị: AllGather lại trước khi đơn vị tính, bỏ khi xong.
    4. Gradient của tham số đầy đủ đi bằng ReduceScatter (chia cho N), thành ``shard.grad``.
    """
    raise NotImplementedError("Bài E: hãy viết fully_shard_scratch.")
