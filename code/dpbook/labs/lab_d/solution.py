"""Bài D, lời giải mẫu: Ring AllReduce từ send/recv, và một DDP có bucket gradient.

Chạy không cần sửa trên các rank CPU (gloo) và trên mỗi rank một GPU (NCCL): không dòng nào
ghi tên thiết bị.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dpbook import vi


def ring_all_reduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` over the default group, in place: reduce-scatter, then all-gather, each
    N - 1 steps in which every rank sends one chunk to its right and receives one from its left."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    # tensor_split gives N chunks for any size (the first ones one element longer, some maybe
    # empty): no padding, and every rank computes the same cuts.
    chunks = flat.tensor_split(world)
    right, left = (rank + 1) % world, (rank - 1) % world
    inbox = torch.empty_like(chunks[0])  # chunk 0 is the longest

    def exchange(send: int, recv: int, into: torch.Tensor) -> None:
        # isend, not send: a blocking send may wait until the peer has posted its recv, and if
        # every rank blocked in send first, the ring would wait for ever.
        request = dist.isend(chunks[send], right)
        dist.recv(into, left)
        request.wait()

    # Reduce-scatter: at step s, send the partial sum of chunk (rank - s) and add the received
    # one into chunk (rank - s - 1). After N - 1 steps chunk (rank + 1) holds the full sum.
    for s in range(world - 1):
        send, recv = (rank - s) % world, (rank - s - 1) % world
        got = inbox[:chunks[recv].numel()]
        exchange(send, recv, got)
        chunks[recv].add_(got)
    # All-gather: pass the finished chunks around; each arrives straight in its place.
    for s in range(world - 1):
        send, recv = (rank + 1 - s) % world, (rank - s) % world
        exchange(send, recv, chunks[recv])
    if flat.data_ptr() != tensor.data_ptr():  # tensor was not contiguous: copy the sums back
        tensor.copy_(flat.view_as(tensor))


class PendingBucket:
    """One bucket in flight: its parameters, the flat buffer being all-reduced, the work."""

    def __init__(self, params: list[nn.Parameter], flat: torch.Tensor, work) -> None:
        self.params, self.flat, self.work = params, flat, work

    def __repr__(self) -> str:
        done = "xong" if self.work.is_completed() else "đang chạy"
        nbytes = self.flat.numel() * self.flat.element_size()
        return f"PendingBucket({len(self.params)} tensor, {vi.grouped(nbytes)} byte, {done})"


class MyDDP(nn.Module):
    """Data parallelism by hand: rank 0's state broadcast once, then per backward the gradients
    packed into buckets in the order they become ready, each bucket all-reduced as soon as it
    holds ``bucket_cap_mb`` MiB, while backward goes on computing the earlier layers."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        self.cap_bytes = int(bucket_cap_mb * 1024 * 1024)  # MiB, as in PyTorch's DDP
        self.world_size = dist.get_world_size()
        with torch.no_grad():  # every rank starts from rank 0's parameters and buffers
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.pending: list[PendingBucket] = []  # launched, not yet waited for
        self._bucket: list[nn.Parameter] = []  # the open bucket
        self._bucket_bytes = 0
        self._ready = 0  # gradients ready in this backward
        for p in self.params:
            # Fires once p.grad holds this backward's gradient (after accumulation).
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, p: nn.Parameter) -> None:
        self._bucket.append(p)
        self._bucket_bytes += p.grad.numel() * p.grad.element_size()
        self._ready += 1
        # Close the bucket once it reaches the cap (the tensor that crosses it stays in, as in
        # DDP's packing), and the last one when every gradient is in.
        if self._bucket_bytes >= self.cap_bytes or self._ready == len(self.params):
            self._launch()

    def _launch(self) -> None:
        params, self._bucket, self._bucket_bytes = self._bucket, [], 0
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat.div_(self.world_size)  # sum of grad / N = the average (what DDP's hook does)
        # async_op=True returns at once: backward continues while the bucket travels.
        self.pending.append(PendingBucket(params, flat, dist.all_reduce(flat, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket, then copy the averages back into each ``.grad``."""
        if self._bucket:  # some gradients never became ready: send what there is
            self._launch()
        for bucket in self.pending:
            bucket.work.wait()
            offset = 0
            for p in bucket.params:
                n = p.grad.numel()
                p.grad.copy_(bucket.flat[offset:offset + n].view_as(p.grad))
                offset += n
        self.pending, self._ready = [], 0
