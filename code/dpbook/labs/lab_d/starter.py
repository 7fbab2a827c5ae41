"""Bài D: tự viết DDP. Sao chép file này (chẳng hạn thành my_ddp.py), điền các TODO, rồi chạy

    python -m dpbook.labs.lab_d.checker my_ddp.py

Trong ring_all_reduce chỉ dùng giao tiếp điểm–điểm của torch.distributed (send, recv, isend,
irecv); trong MyDDP dùng dist.broadcast và dist.all_reduce. Đừng ghi tên thiết bị nào: cùng một
file phải chạy được trên các rank CPU (gloo) và trên mỗi rank một GPU (NCCL).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def ring_all_reduce(tensor: torch.Tensor) -> None:
    """Cộng ``tensor`` trên mọi rank của group mặc định, tại chỗ (như
    ``dist.all_reduce(tensor)``), theo vòng: mỗi rank chỉ gửi cho ``(rank + 1) % N`` và chỉ
    nhận từ ``(rank - 1) % N``.

    1. Cắt tensor đã làm phẳng thành N đoạn; kích thước nào cũng phải chạy, kể cả khi N không
       chia hết nó và khi nó nhỏ hơn N (``Tensor.tensor_split`` cắt đúng như vậy).
    2. ReduceScatter, N - 1 bước: gửi một đoạn sang phải, nhận một đoạn từ trái, cộng nó vào
       bản của mình. Xong bước này mỗi rank giữ một đoạn đã cộng đủ.
    3. AllGather, N - 1 bước: chuyển các đoạn đã cộng đủ quanh vòng cho đến khi rank nào cũng có
       đủ.

    Tổng cộng mỗi rank gửi 2 (N - 1) / N số byte của tensor.
    """
    # TODO: world size, rank, hai rank hàng xóm (trái, phải).
    # TODO: các đoạn của tensor phẳng (view, để cộng vào đoạn là sửa chính `tensor`).
    # TODO: ReduceScatter. Gửi bằng dist.isend trước khi gọi dist.recv (chặn), rồi chờ lệnh gửi
    #       xong: nếu mọi rank cùng chặn ở send trước, vòng có thể chờ nhau mãi.
    # TODO: AllGather.
    raise NotImplementedError("TODO: ring_all_reduce")


class MyDDP(nn.Module):
    """Bọc ``module`` để huấn luyện song song dữ liệu, như ``DistributedDataParallel``.

    Một bước huấn luyện với nó::

        loss = loss_fn(model(x), y)
        loss.backward()                          # các bucket được AllReduce trong lúc backward
        model.finish_gradient_synchronization()  # giờ mọi .grad là trung bình trên các rank
        optimizer.step()
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        # TODO: broadcast tham số VÀ buffer của rank 0 sang mọi rank (trong torch.no_grad()).
        # TODO: giới hạn bucket theo byte: MB ở đây là MiB, int(bucket_cap_mb * 1024 * 1024).
        # TODO: trên mỗi tham số cần gradient, đăng ký một hook chạy khi gradient của nó sẵn
        #       sàng: p.register_post_accumulate_grad_hook(fn); fn(p) đọc được p.grad.
        raise NotImplementedError("TODO: MyDDP.__init__")

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # TODO: hàm hook. Thêm gradient vào bucket đang mở; khi số byte của bucket đạt giới hạn
    #       (>=: gradient làm vượt giới hạn ở lại trong bucket, như DDP của PyTorch), hoặc khi
    #       mọi gradient của lượt backward này đã vào, phát bucket đi: làm phẳng các gradient
    #       của nó thành một tensor, chia cho world size, rồi gọi
    #           work = dist.all_reduce(flat, async_op=True)
    #       lời gọi trả về ngay, nên backward chạy tiếp trong lúc bucket đang truyền. Giữ lại
    #       (các tham số, flat, work) của mọi bucket đã phát.

    def finish_gradient_synchronization(self) -> None:
        """Chờ mọi bucket đang chờ (``work.wait()``), chép giá trị trung bình về ``.grad`` của
        từng tham số; sau đó không còn bucket nào đang chờ."""
        raise NotImplementedError("TODO: finish_gradient_synchronization")
