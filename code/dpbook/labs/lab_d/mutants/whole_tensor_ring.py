"""Ring gửi CẢ tensor (tổng đang cộng dồn) cho rank bên phải N − 1 lần, không chia đoạn: đúng giá trị, ở N = 2 cả tổng byte cũng đúng (review G1); mục ring_bytes phải bắt (mỗi lần gửi > 1/N tensor)."""

import torch
import torch.distributed as dist

from dpbook.labs.lab_d.solution import MyDDP

__all__ = ["ring_all_reduce", "MyDDP"]


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % world, (rank - 1) % world
    passing = tensor.clone()  # what travels: starts as my own tensor
    total = tensor.clone()
    for _ in range(world - 1):
        got = torch.empty_like(passing)
        request = dist.isend(passing, right)  # SAI: cả tensor, không phải một đoạn
        dist.recv(got, left)
        request.wait()
        total += got
        passing = got
    tensor.copy_(total)
