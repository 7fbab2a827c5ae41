"""Ring AllReduce, step by step, as data: the frames of the animation, built from
``dpbook.collectives``' trace.

Each rank's buffer is drawn as N chunks. Rank r starts with value (r+1)(c+1) in chunk c, so
every final chunk reads (c+1) N(N+1)/2 and a lecturer can check the sums by eye. The
simulation runs twice: once on those values, once on all-ones buffers, whose running sums
count how many ranks' contributions each chunk already holds (N means complete).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import collectives, vi
from ...checks import int_at_least, non_negative

MAX_RANKS = 8


@dataclass(frozen=True)
class RingFrame:
    """The state after ``step`` steps (0: before the first message)."""

    world_size: int
    step: int
    phase: str  # "start", "reduce-scatter", "all-gather"
    phase_step: int  # 1-based within the phase, 0 at the start
    values: tuple[tuple[float, ...], ...]  # [rank][chunk]
    counts: tuple[tuple[int, ...], ...]  # contributions summed into [rank][chunk]
    sends: tuple[collectives.Event, ...]  # messages of this step
    sent: tuple[float, ...]  # cumulative bytes sent by each rank
    received: tuple[float, ...]
    nbytes: float  # size of the whole buffer being all-reduced

    def complete(self, rank: int, chunk: int) -> bool:
        return self.counts[rank][chunk] == self.world_size


def ring_inputs(world_size: int) -> list[torch.Tensor]:
    """Rank r holds (r+1)(c+1) in chunk c: one element per chunk, float64 for exact sums."""
    n = world_size
    return [torch.tensor([(r + 1.0) * (c + 1) for c in range(n)], dtype=torch.float64)
            for r in range(n)]


def ring_frames(world_size: int = 4, nbytes: float = 100e6) -> list[RingFrame]:
    """All 2(N-1)+1 states of a ring AllReduce of a ``nbytes`` buffer on ``world_size`` ranks."""
    int_at_least("world_size", world_size, 2)
    if world_size > MAX_RANKS:
        raise ValueError(f"world_size tối đa là {MAX_RANKS} để hình còn đọc được, "
                         f"nhận được {world_size}.")
    non_negative("nbytes", nbytes)
    n = world_size
    values = collectives.all_reduce(ring_inputs(n), record_states=True)
    counts = collectives.all_reduce([torch.ones(n, dtype=torch.float64)] * n, record_states=True)
    scale = nbytes / n / values.events[0].nbytes  # the simulator moves one element per chunk
    frames, sent, received = [], [0.0] * n, [0.0] * n
    for k, (state, count) in enumerate(zip(values.states, counts.states)):
        phase, phase_step = "start", 0
        sends: tuple = ()
        if k > 0:
            phase = "reduce-scatter" if k <= n - 1 else "all-gather"
            phase_step = k if k <= n - 1 else k - (n - 1)
            sends = tuple(e for e in values.events if e.phase == phase and e.step == phase_step - 1)
            for e in sends:
                sent[e.src] += e.nbytes * scale
                received[e.dst] += e.nbytes * scale
        frames.append(RingFrame(
            n, k, phase, phase_step,
            tuple(tuple(float(v) for v in row) for row in state),
            tuple(tuple(int(v) for v in row) for row in count),
            sends, tuple(sent), tuple(received), float(nbytes)))
    return frames


def caption(f: RingFrame) -> str:
    n = f.world_size
    if f.phase == "start":
        return (f"Ban đầu: mỗi rank chia bộ đệm {vi.nbytes(f.nbytes)} thành {n} mảnh; rank r giữ "
                f"giá trị (r+1)(c+1) ở mảnh c. Chưa byte nào được gửi.")
    if f.phase == "reduce-scatter":
        text = (f"Reduce-scatter, bước {f.phase_step}/{n - 1}: rank r gửi mảnh (r − {f.phase_step - 1})"
                f" mod {n} cho rank r+1, rank nhận cộng vào mảnh của mình.")
        if f.phase_step == n - 1:
            text += " Xong pha đầu: mỗi rank giữ trọn tổng của đúng một mảnh (màu xanh lá)."
        return text
    text = (f"All-gather, bước {f.phase_step}/{n - 1}: rank r chuyển tiếp mảnh đã hoàn chỉnh cho "
            f"rank r+1, rank nhận ghi đè bản cũ.")
    if f.phase_step == n - 1:
        text += (f" Xong: mọi rank có đủ tổng; mỗi rank đã gửi 2({n}−1)/{n} × "
                 f"{vi.nbytes(f.nbytes)} = {vi.nbytes(f.sent[0])} và nhận bấy nhiêu.")
    return text
