"""Pure simulators of the ring collectives, with an event trace of every chunk that moves.

Names and semantics mirror ``torch.distributed``: ``all_reduce`` sums, ``reduce_scatter``
leaves rank ``r`` with chunk ``r`` of the sum, ``all_gather`` concatenates the ranks' shards in
rank order. Each function takes one tensor per rank and returns a ``Result`` with the outputs
and the trace; nothing here starts a process.

As FSDP does, a tensor whose length does not divide by N is padded with zeros up to the next
multiple of N and split into N equal chunks; the padding is removed from the outputs. Every
rank therefore sends exactly ``(N-1)/N`` of the padded size per phase.

For comparison: ``naive_all_reduce`` (everything through rank 0) and ``switch_all_reduce`` (the
sum computed in the network switch, as NVLink SHARP and InfiniBand SHARP do).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Event:
    """One message: in ``step`` of ``phase``, ``src`` sends chunk ``chunk`` to ``dst``."""

    phase: str  # "reduce-scatter", "all-gather"; "gather"/"broadcast", "to-switch"/"from-switch"
    step: int  # 0-based within the phase
    src: int
    dst: int
    chunk: int
    nbytes: int


@dataclass
class Result:
    """Outputs per rank, the trace, and (optionally) every rank's buffer after each step."""

    outputs: list[torch.Tensor]
    events: list[Event]
    world_size: int
    padded_numel: int
    states: list[list[torch.Tensor]] = field(default_factory=list)

    def bytes_sent(self, rank: int) -> int:
        return sum(e.nbytes for e in self.events if e.src == rank)

    def bytes_received(self, rank: int) -> int:
        return sum(e.nbytes for e in self.events if e.dst == rank)

    @property
    def steps(self) -> int:
        return len({(e.phase, e.step) for e in self.events})


def _validate(tensors: list[torch.Tensor]) -> None:
    if not isinstance(tensors, (list, tuple)) or len(tensors) < 1:
        raise ValueError("cần một danh sách gồm ít nhất một tensor, mỗi rank một tensor.")
    first = tensors[0]
    for r, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"tensor của rank {r} phải là tensor một chiều.")
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(
                f"mọi rank phải có tensor cùng kích thước và kiểu: rank 0 có "
                f"{tuple(first.shape)}/{first.dtype}, rank {r} có {tuple(t.shape)}/{t.dtype}."
            )


def _chunked(tensors: list[torch.Tensor]) -> tuple[list[list[torch.Tensor]], int, int]:
    """Pad every buffer to a multiple of N and split it into N chunk copies."""
    n, numel = len(tensors), tensors[0].numel()
    chunk = -(-numel // n)
    padded = [torch.cat([t, t.new_zeros(chunk * n - numel)]) for t in tensors]
    return [list(p.clone().split(chunk)) for p in padded], chunk, numel


def _snapshot(bufs: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [torch.cat(b).clone() for b in bufs]


def _reduce_scatter_phase(bufs, chunk, item, events, states, record, offset) -> None:
    """N-1 steps; at step s rank r sends chunk (r + offset - s) mod N to rank r+1, which adds
    it. Afterwards rank r holds the complete sum of chunk (r + offset + 1) mod N."""
    n = len(bufs)
    for s in range(n - 1):
        moves = [(r, (r + 1) % n, (r + offset - s) % n) for r in range(n)]
        sent = [bufs[src][c].clone() for src, _, c in moves]  # all sends happen at once
        for (src, dst, c), payload in zip(moves, sent):
            bufs[dst][c] += payload
            events.append(Event("reduce-scatter", s, src, dst, c, chunk * item))
        if record:
            states.append(_snapshot(bufs))


def _all_gather_phase(bufs, chunk, item, events, states, record, owned) -> None:
    """N-1 steps; rank r starts with the complete chunk ``owned(r)`` and passes chunks on."""
    n = len(bufs)
    for s in range(n - 1):
        moves = [(r, (r + 1) % n, (owned(r) - s) % n) for r in range(n)]
        sent = [bufs[src][c].clone() for src, _, c in moves]
        for (src, dst, c), payload in zip(moves, sent):
            bufs[dst][c] = payload
            events.append(Event("all-gather", s, src, dst, c, chunk * item))
        if record:
            states.append(_snapshot(bufs))


def all_reduce(tensors: list[torch.Tensor], record_states: bool = False) -> Result:
    """Ring AllReduce (sum): reduce-scatter then all-gather, 2(N-1) steps."""
    _validate(tensors)
    n = len(tensors)
    bufs, chunk, numel = _chunked(tensors)
    item = tensors[0].element_size()
    events: list[Event] = []
    states: list[list[torch.Tensor]] = [_snapshot(bufs)] if record_states else []
    _reduce_scatter_phase(bufs, chunk, item, events, states, record_states, offset=0)
    _all_gather_phase(bufs, chunk, item, events, states, record_states, lambda r: (r + 1) % n)
    outputs = [torch.cat(b)[:numel] for b in bufs]
    return Result(outputs, events, n, chunk * n, states)


def reduce_scatter(tensors: list[torch.Tensor], record_states: bool = False) -> Result:
    """Ring ReduceScatter (sum): rank r ends with chunk r of the sum, N-1 steps.

    The ring starts one chunk earlier than in ``all_reduce`` so that each completed chunk lands
    on its owner, as ``torch.distributed.reduce_scatter_tensor`` specifies.
    """
    _validate(tensors)
    n = len(tensors)
    bufs, chunk, numel = _chunked(tensors)
    item = tensors[0].element_size()
    events: list[Event] = []
    states: list[list[torch.Tensor]] = [_snapshot(bufs)] if record_states else []
    _reduce_scatter_phase(bufs, chunk, item, events, states, record_states, offset=-1)
    outputs = _unpad_shards([bufs[r][r] for r in range(n)], numel)
    return Result(outputs, events, n, chunk * n, states)


def _unpad_shards(shards: list[torch.Tensor], numel: int) -> list[torch.Tensor]:
    """Drop the zero padding that fell into the last shards."""
    out, start = [], 0
    for s in shards:
        keep = max(0, min(len(s), numel - start))
        out.append(s[:keep].clone())
        start += len(s)
    return out


def all_gather(shards: list[torch.Tensor], record_states: bool = False) -> Result:
    """Ring AllGather: every rank ends with the concatenation of all shards, N-1 steps."""
    _validate(shards)
    n, chunk = len(shards), shards[0].numel()
    item = shards[0].element_size()
    bufs = [[torch.zeros_like(shards[0]) for _ in range(n)] for _ in range(n)]
    for r in range(n):
        bufs[r][r] = shards[r].clone()
    events: list[Event] = []
    states: list[list[torch.Tensor]] = [_snapshot(bufs)] if record_states else []
    _all_gather_phase(bufs, chunk, item, events, states, record_states, lambda r: r)
    outputs = [torch.cat(b) for b in bufs]
    return Result(outputs, events, n, chunk * n, states)


def naive_all_reduce(tensors: list[torch.Tensor]) -> Result:
    """Everyone sends to rank 0, which sums and sends the result back: 2 steps, rank 0 busiest."""
    _validate(tensors)
    n, numel = len(tensors), tensors[0].numel()
    nbytes = numel * tensors[0].element_size()
    total = tensors[0].clone()
    events = []
    for r in range(1, n):
        total += tensors[r]
        events.append(Event("gather", 0, r, 0, 0, nbytes))
    events += [Event("broadcast", 0, 0, r, 0, nbytes) for r in range(1, n)]
    return Result([total.clone() for _ in range(n)], events, n, numel)


SWITCH = -1  # the ``src``/``dst`` of a message to or from the switch in ``switch_all_reduce``


def switch_all_reduce(tensors: list[torch.Tensor]) -> Result:
    """AllReduce with the reduction done in the network, the shape of NVLink SHARP (NCCL's NVLS
    algorithms) or InfiniBand SHARP (NCCL's CollNet): every rank sends its whole buffer once to
    the switch (``SWITCH``), the switch adds them and sends the sum once to every rank.

    A model of the bytes each GPU moves (n out, n in), not of NCCL's kernels, which split the
    buffer into chunks and pipeline them. The ring's lower bound 2(N-1)/N n does not apply: it
    counts the gathering and the spreading that the GPUs do themselves, and here the switch does
    them.
    """
    _validate(tensors)
    n, numel = len(tensors), tensors[0].numel()
    nbytes = numel * tensors[0].element_size()
    total = torch.stack([t for t in tensors]).sum(0)
    events = [Event("to-switch", 0, r, SWITCH, 0, nbytes) for r in range(n)]
    events += [Event("from-switch", 0, SWITCH, r, 0, nbytes) for r in range(n)]
    return Result([total.clone() for _ in range(n)], events, n, numel)
