"""Reproduce the gloo rendezvous failure that made the test suite flaky, then show the fix.

Two ranks join a gloo group and leave at once, as ``workers.say_hello`` does (no collective).
Rank 1 runs at the lowest CPU priority while two busy loops load the cores, as on a 2-core CI
machine running two test workers. gloo's connecting side counts a pair as connected as soon as
it has written its sequence number into the socket, before the listening side has accepted:
rank 0 can then finish ``init_process_group``, destroy its group and close the socket while
rank 1 is still inside ``connectFullMesh``, and rank 1 fails with "Connection closed by peer".
``TORCH_DIST_INIT_BARRIER=1`` makes ``init_process_group`` end with a store barrier, so no rank
leaves before every rank has finished connecting.

    .venv/bin/python benchmarks/gloo_init_race.py            # both variants, 100 launches each
"""

import argparse
import datetime
import multiprocessing as mp
import os


def _rank(rank, port, q, barrier):
    import torch.distributed as dist

    if barrier:
        os.environ["TORCH_DIST_INIT_BARRIER"] = "1"
    if rank == 1:
        os.nice(19)
    wait = datetime.timedelta(seconds=60)
    try:
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=wait)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=wait)
        dist.destroy_process_group()
        q.put(None)
    except Exception as exc:  # noqa: BLE001 - counted, not raised
        q.put(str(exc).splitlines()[0])


def _hog():
    while True:
        pass


def run(launches: int, barrier: bool) -> tuple[int, list[str]]:
    import torch.distributed as dist

    ctx = mp.get_context("fork")  # this script only: fast, and nothing here touches CUDA
    hogs = [ctx.Process(target=_hog, daemon=True) for _ in range(2)]
    for h in hogs:
        h.start()
    failed, messages = 0, []
    try:
        for _ in range(launches):
            store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
            q = ctx.Queue()
            ranks = [ctx.Process(target=_rank, args=(r, store.port, q, barrier)) for r in (0, 1)]
            for p in ranks:
                p.start()
            errors = [m for m in (q.get(timeout=120) for _ in ranks) if m]
            for p in ranks:
                p.join()
            failed += bool(errors)
            messages += errors
    finally:
        for h in hogs:
            h.kill()
    return failed, messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=100)
    args = parser.parse_args()
    for barrier in (False, True):
        failed, messages = run(args.launches, barrier)
        label = "TORCH_DIST_INIT_BARRIER=1" if barrier else "không có barrier"
        print(f"{label}: {failed}/{args.launches} lần khởi động thất bại")
        if messages:
            print("  ví dụ:", messages[0][:160])


if __name__ == "__main__":
    main()
