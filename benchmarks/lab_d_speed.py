"""Lab D: the reference ``MyDDP`` against PyTorch's ``DistributedDataParallel``, same model, same
cap, same data, 2 ranks; steps per second of each, as a ratio measured in one run (median of
repeated steps, the two wrappers' steps interleaved so that both see the same machine load).
Goal: MyDDP >= 0.9x DDP. A benchmark, not a test.

    .venv/bin/python benchmarks/lab_d_speed.py [--hidden 1024] [--depth 8] [--cap-mb 4]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from dpbook import launch, vi
from dpbook.measure import sync


def worker(rank: int, world_size: int, hidden: int, depth: int, cap_mb: float, batch: int,
           repeats: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpbook.labs.lab_d.solution import MyDDP
    from dpbook.models import build_mlp

    dev = launch.device()
    kw = dict(in_dim=hidden, hidden=hidden, depth=depth, out_dim=hidden)
    ids = [dev.index] if dev.type == "cuda" else None
    wrapped = {"ddp": DDP(build_mlp(0, **kw).to(dev), device_ids=ids, bucket_cap_mb=cap_mb),
               "mine": MyDDP(build_mlp(0, **kw).to(dev), bucket_cap_mb=cap_mb)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in wrapped.items()}
    g = torch.Generator().manual_seed(rank)
    x, y = (torch.randn(batch, hidden, generator=g).to(dev) for _ in range(2))

    def step(name):
        model, opt = wrapped[name], opts[name]
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        if name == "mine":
            model.finish_gradient_synchronization()
        opt.step()

    times = {k: [] for k in wrapped}
    for i in range(repeats + 3):  # 3 warm-up steps: DDP rebuilds its buckets at step 2
        for name in (("ddp", "mine") if i % 2 else ("mine", "ddp")):
            sync(dev)
            t0 = time.perf_counter()
            step(name)
            sync(dev)
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in wrapped["ddp"].parameters())
    return {"median": {k: statistics.median(v) for k, v in times.items()}, "params": n_params}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--cap-mb", type=float, default=4.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args()
    print(launch.describe_mode(2))
    reports = launch.spawn(worker, a.hidden, a.depth, a.cap_mb, a.batch, a.repeats,
                           world_size=2, timeout=600, output="none")
    # a step ends when the slowest rank's does: the rank with the larger median decides
    med = {k: max(r["median"][k] for r in reports) for k in ("ddp", "mine")}
    print(f"MLP {a.depth} × {a.hidden}: {vi.grouped(reports[0]['params'])} tham số, "
          f"bucket_cap_mb = {vi.general(a.cap_mb)}, batch {a.batch} mỗi rank, "
          f"{a.repeats} bước mỗi bản")
    for k, label in (("ddp", "DistributedDataParallel"), ("mine", "MyDDP (lời giải mẫu)")):
        print(f"  {label:<26} {vi.ms(med[k])} mỗi bước, {vi.number(1 / med[k], 2)} bước/s")
    print(f"Tỷ số bước/s MyDDP ÷ DDP: {vi.number(med['ddp'] / med['mine'], 2)} (mục tiêu ≥ 0,9)")


if __name__ == "__main__":
    main()
