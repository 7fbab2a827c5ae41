"""Bài D, bản cố tình sai: Ring AllReduce chỉ đúng khi N chia hết kích thước tensor.

Nó cắt tensor thành N đoạn ``numel // N`` phần tử và quên phần dư, nên ``numel % N`` phần tử
cuối không bao giờ được cộng. ``MyDDP`` lấy từ lời giải mẫu.
"""

from __future__ import annotations

import torch.distributed as dist

from dpbook.labs.lab_d.solution import MyDDP

__all__ = ["ring_all_reduce", "MyDDP"]  # what the learner's file defines


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1)
    size = flat.numel() // world  # MISTAKE: the numel % world last elements belong to no chunk
    chunks = [flat[i * size:(i + 1) * size] for i in range(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    for s in range(world - 1):  # reduce-scatter
        send, recv = (rank - s) % world, (rank - s - 1) % world
        got = chunks[recv].clone()
        request = dist.isend(chunks[send], right)
        dist.recv(got, left)
        request.wait()
        chunks[recv].add_(got)
    for s in range(world - 1):  # all-gather
        send, recv = (rank + 1 - s) % world, (rank - s) % world
        request = dist.isend(chunks[send], right)
        dist.recv(chunks[recv], left)
        request.wait()
