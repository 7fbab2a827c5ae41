"""Bài E, lời giải mẫu: ZeRO-1 (``ShardedOptimizer``) và FSDP/ZeRO-3 (``fully_shard_scratch``)
viết từ đầu, chỉ bằng các phép toán tập thể của ``torch.distributed`` và cơ chế autograd.

Cách lưu một tham số sau ``fully_shard_scratch`` (bộ kiểm tra dựa vào quy ước này): tham số
``p`` có ``numel`` phần tử được duỗi phẳng, đệm số 0 ở cuối cho đủ ``N * s`` phần tử với
``s = ceil(numel / N)``, và rank ``r`` giữ đoạn ``[r*s, (r+1)*s)`` dưới dạng một ``Parameter``
1 chiều, vẫn mang tên cũ (``blocks.0.linear.weight``...).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

# --------------------------------------------------------------------------------------------
# ZeRO-1: mỗi rank chỉ giữ trạng thái bộ tối ưu của các tham số nó sở hữu.


def owners(params: list[torch.Tensor], world_size: int) -> list[int]:
    """Rank sở hữu từng tham số: lần lượt từ tham số lớn nhất, giao cho rank đang nhẹ nhất.
    Cách tham lam này (như ``ZeroRedundancyOptimizer._partition_parameters``) bảo đảm không rank
    nào giữ quá ``tổng / N + tham số lớn nhất`` phần tử."""
    load, owner = [0] * world_size, [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        owner[i] = min(range(world_size), key=load.__getitem__)
        load[owner[i]] += params[i].numel()
    return owner


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_cls(các tham số của rank này, **kwargs)`` bọc lại: mỗi rank cập nhật phần
    của mình, rồi phát (Broadcast) các tham số vừa cập nhật từ rank sở hữu sang mọi rank.
    ``self.state`` là trạng thái của bộ tối ưu bên trong: chỉ các tham số của rank này."""

    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        if not params or not all(isinstance(p, torch.Tensor) for p in params):
            raise ValueError("ShardedOptimizer cần một danh sách tham số (tensor) không rỗng; "
                             "chưa hỗ trợ nhóm tham số (dict).")
        super().__init__(params, kwargs)
        self.owner = owners(params, dist.get_world_size())
        mine = [p for p, r in zip(params, self.owner) if r == dist.get_rank()]
        # Một rank có thể không sở hữu tham số nào (ít tham số hơn số rank).
        self.local = optimizer_cls(mine, **kwargs) if mine else None
        self.state = self.local.state if self.local else self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local is not None:
            self.local.step()
        # Mọi rank gọi broadcast cho mọi tham số, cùng thứ tự: rank sở hữu gửi, các rank khác
        # nhận vào đúng tensor ấy. Tổng cộng mỗi tham số đi một lần.
        for p, src in zip(self.param_groups[0]["params"], self.owner):
            dist.broadcast(p.data, src=src)
        return loss


# --------------------------------------------------------------------------------------------
# FSDP (ZeRO-3): tham số chỉ đầy đủ trong lúc đơn vị của nó tính.


class GatherParams(torch.autograd.Function):
    """Lượt xuôi: AllGather các shard của một đơn vị thành tham số đầy đủ. Lượt ngược: đạo hàm của
    AllGather chính là ReduceScatter. Gradient của tham số đầy đủ (mỗi rank một bản, tính trên
    batch của mình) được cộng qua các rank và cắt ra, mỗi rank nhận đúng phần ứng với shard của
    nó, chia cho N để lấy trung bình như DDP. Autograd cộng kết quả vào ``shard.grad``."""

    @staticmethod
    def forward(ctx, unit, *shards):
        ctx.unit = unit
        return tuple(unit.full_views(unit.gather()))

    @staticmethod
    def backward(ctx, *full_grads):
        unit = ctx.unit
        shard_grads = [unit.reduce_grad(i, g) for i, g in enumerate(full_grads)]
        unit.bwd_buffers = None  # đơn vị đã tính xong lượt ngược: bỏ bản đầy đủ gom lại lần hai
        return (None, *shard_grads)


class ShardedUnit:
    """Một đơn vị đã chia mảnh: các shard (tham số thật của mô hình) và các hook."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.slots = []  # (module con sở hữu, tên, shape, numel) của từng tham số
        self.shards = []
        for name, p in list(module.named_parameters()):
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            s = math.ceil(p.numel() / self.n)
            flat = torch.zeros(self.n * s, dtype=p.dtype, device=p.device)
            flat[:p.numel()] = p.detach().flatten()  # phần đệm (padding) là số 0
            shard = nn.Parameter(flat[self.rank * s:(self.rank + 1) * s].clone())
            setattr(owner, attr, shard)  # thay tham số đầy đủ bằng shard, giữ nguyên tên
            self.slots.append((owner, attr, p.shape, p.numel()))
            self.shards.append(shard)
        self.fulls = None  # tham số đầy đủ, chỉ có trong lúc đơn vị tính lượt xuôi
        self.bwd_buffers = None  # bản gom lại cho lượt ngược
        self.saving = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        module.register_forward_pre_hook(self.pre_forward)
        module.register_forward_hook(self.post_forward, always_call=True)

    @torch.no_grad()
    def gather(self) -> list[torch.Tensor]:
        """AllGather mỗi shard vào một buffer ``N * s`` phần tử (còn nguyên phần đệm)."""
        out = []
        for shard in self.shards:
            buf = torch.empty(self.n * shard.numel(), dtype=shard.dtype, device=shard.device)
            dist.all_gather_single(buf, shard)
            out.append(buf)
        return out

    def full_views(self, buffers):
        return [buf[:numel].view(shape) for buf, (_, _, shape, numel) in zip(buffers, self.slots)]

    def reduce_grad(self, i: int, full_grad: torch.Tensor | None):
        if full_grad is None:
            return None
        shard = self.shards[i]
        flat = torch.zeros(self.n * shard.numel(), dtype=full_grad.dtype, device=full_grad.device)
        flat[:full_grad.numel()] = full_grad.flatten()
        out = torch.empty_like(shard)
        dist.reduce_scatter_single(out, flat)  # mặc định ReduceOp.SUM
        return out / self.n

    def pre_forward(self, module, args):
        # Gom ngay trước khi đơn vị tính; module con đọc ``linear.weight`` thấy bản đầy đủ vì nó
        # nằm trong __dict__ của module con, che tham số shard cùng tên trong _parameters
        # (named_parameters() và optimizer vẫn thấy shard).
        self.fulls = GatherParams.apply(self, *self.shards)
        for (owner, attr, _, _), full in zip(self.slots, self.fulls):
            owner.__dict__[attr] = full
        self.saving.__enter__()

    def post_forward(self, module, args, output):
        self.saving.__exit__(None, None, None)
        for owner, attr, _, _ in self.slots:
            owner.__dict__.pop(attr, None)
        self.fulls = None  # không còn ai giữ tham số đầy đủ: bộ nhớ được trả lại ngay
        # Lượt ngược đến đơn vị này khi gradient của đầu ra đơn vị có: hook trên đầu ra chạy đầu
        # tiên, trước mọi phép tính ngược của đơn vị (FSDP2 làm vậy trong
        # FSDPState._register_pre_backward_hook).
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(self.pre_backward)

    def pre_backward(self, grad):
        if self.bwd_buffers is None:
            self.bwd_buffers = self.gather()

    def pack(self, t: torch.Tensor):
        """Autograd muốn giữ ``t`` cho lượt ngược. Nếu ``t`` là (một view của) tham số đầy đủ,
        chỉ giữ địa chỉ của nó: chỉ số tham số và hình dạng view; còn lại giữ như thường."""
        ptr = t.untyped_storage().data_ptr()
        for i, full in enumerate(self.fulls):
            if full.untyped_storage().data_ptr() == ptr:
                return i, t.size(), t.stride(), t.storage_offset()
        return t

    def unpack(self, saved):
        """Lượt ngược cần lại tensor đã giữ: lấy từ bản vừa gom lại (``pre_backward``)."""
        if isinstance(saved, torch.Tensor):
            return saved
        i, size, stride, offset = saved
        if self.bwd_buffers is None:  # chỉ khi đầu ra đơn vị không phải một tensor
            self.bwd_buffers = self.gather()
        return self.bwd_buffers[i].as_strided(size, stride, offset)


def check_units(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """Các đơn vị phải là module con của ``model``, có tham số, không lồng nhau."""
    inside = {id(m) for m in model.modules()}
    seen = set()
    for unit in units:
        if id(unit) not in inside:
            raise ValueError("Mỗi đơn vị FSDP (phần tử của đối số thứ hai) phải là một module con của model.")
        ids = {id(p) for p in unit.parameters()}
        if not ids or ids & seen:
            raise ValueError("Mỗi đơn vị phải có tham số, và hai đơn vị không được chung tham số "
                             "(không lồng đơn vị này trong đơn vị kia).")
        seen |= ids
    return list(units)


def fully_shard_scratch(model: nn.Module, units: list[nn.Module]) -> None:
    """Chia mảnh từng đơn vị của ``units`` (tại chỗ)."""
    for unit in check_units(model, units):
        ShardedUnit(unit)
