"""Reproduce the memory reading that made 4.2.7 (II)'s recomputation assert fail at random, then
show the fix.

Two gloo ranks shard ``BucketNet`` with FSDP2 (one unit per block, ``reshard_after_forward=True``),
with and without activation checkpointing, and read ``MemTracker``'s current bytes right after each
forward (``modern_fsdp.MemoryProbe``), ``--marks`` times per mode. gloo runs each collective on a
worker thread that releases the finished work, and with it the AllGather output the work holds,
only after ``wait()`` has returned in the rank's thread (``ProcessGroupGloo::runLoop``:
``workInProgress_[workerIndex].reset()`` after ``execute``). When that thread is late, the last
block's gathered parameters (264 960 B) are still alive at the mark. The fix
(``measure.settle_collectives``, which ``MemoryProbe`` calls before each mark): a barrier outside
the tracker, then a pause longer than the interpreter's switch interval, for the worker to take
the GIL and drop the work.

    .venv/bin/python benchmarks/fsdp_memory_race.py [--marks 200]

Printed before the fix on the 2-core reference machine: 12 of 800 marks off (1,5 %), every one by
264 960 B, the storage freed within 0,2 s after the mark; with it: 0 of 800.
"""

import argparse
import collections

import torch

from dpbook import launch
from dpbook.pages import modern_fsdp as mf


def marks(rank: int, world_size: int, n: int, settle: bool) -> dict:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper, apply_activation_checkpointing)

    from dpbook.models import BucketBlock, build_bucket_net
    from dpbook.train import shard_blocks, train_step

    seen = collections.Counter()
    for mode in ("không", "có"):
        model = build_bucket_net()
        if mode == "có":
            apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, BucketBlock))
        shard_blocks(model, CheckpointWrapper if mode == "có" else BucketBlock,
                     reshard_after_forward=True)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = mf._data(rank, world_size, mf.AC_BATCH, 32, 256)
        train_step(model, opt, x, y)
        for _ in range(n):
            with mf.MemoryProbe(model, opt, settle=settle) as probe:
                probe.mark("start")
                out = model(x)
                probe.mark("after forward")
                torch.nn.functional.mse_loss(out, y).backward()
            opt.zero_grad(set_to_none=True)
            seen[(mode, probe.relative()["after forward"])] += 1
    return dict(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marks", type=int, default=200, help="số lần đo mỗi chế độ, mỗi rank")
    args = parser.parse_args()
    expected = {"không": mf.activation_bytes(mf.AC_BATCH),
                "có": mf.activation_bytes(mf.AC_BATCH, checkpointed=True)}
    for settle in (False, True):
        results = launch.spawn(marks, world_size=2, timeout=1200, output="none",
                               n=args.marks, settle=settle)
        total = off = 0
        extra = collections.Counter()
        for seen in results:
            for (mode, alive), count in seen.items():
                total += count
                if alive != expected[mode]:
                    off += count
                    extra[alive - expected[mode]] += count
        name = "settle_collectives()" if settle else "đọc ngay, không chờ"
        print(f"{name:<30} {off} / {total} lần đo lệch; lệch (B): {dict(extra) or '-'}")


if __name__ == "__main__":
    main()
