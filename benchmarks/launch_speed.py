"""Warm 2-rank launch: ``dpbook.launch.spawn`` (forkserver with torch preloaded) against
``torch.multiprocessing.spawn`` for the same worker, medians of 10 runs measured in one run.

    .venv/bin/python benchmarks/launch_speed.py
"""

import datetime
import statistics
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from dpbook import launch, workers


def _mp_worker(rank: int, world_size: int, port: int) -> None:
    """What a torch.multiprocessing.spawn user writes: join, run the same worker, leave."""
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    workers.all_reduce_rank_ids(rank, world_size)
    dist.destroy_process_group()


def _torch_spawn() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    mp.spawn(_mp_worker, args=(2, store.port), nprocs=2)


def _dpbook_spawn() -> None:
    launch.spawn(workers.all_reduce_rank_ids, world_size=2, backend="gloo", output="none")


def median_s(fn, runs: int = 10) -> float:
    fn()  # warm: the forkserver is started, the modules are imported in this process
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ours = median_s(_dpbook_spawn)
    theirs = median_s(_torch_spawn)
    print(f"dpbook.launch.spawn (2 rank, gloo, đã ấm): trung vị {ours:.3f} s / lần")
    print(f"torch.multiprocessing.spawn (cùng worker): trung vị {theirs:.3f} s / lần")
    print(f"tỷ lệ: nhanh hơn {theirs / ours:.1f} lần")


if __name__ == "__main__":
    main()
