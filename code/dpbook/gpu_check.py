"""``make gpu-check``: run the book's GPU code path on this machine and print a short table.

For each world size 1, 2, 4, 8 (and the GPU count) up to the number of visible GPUs: NCCL
init, one DDP step and one FSDP2 step of a model large enough to show in CUDA's peak memory,
with the measured communication checked against ``dpbook.costs``; then the GPU path of each
part-4.2 page (``dpbook.gpu_pages``). On a machine without a GPU it says so and exits with
status 0.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from . import costs, gpu_pages, launch, measure
from .train import Parallel

# Big enough that parameters dominate CUDA's peak memory, small enough for any GPU.
GPU_MODEL = {"in_dim": 1024, "hidden": 2048, "depth": 4, "out_dim": 1024}


def world_sizes(gpus: int) -> list[int]:
    return sorted({w for w in (1, 2, 4, 8, gpus) if 1 <= w <= gpus})


def predicted_bytes(report: dict, par: Parallel, world_size: int) -> float:
    param_bytes = 4 * report["num_params"]
    if par.method == "ddp":
        return costs.ddp_step_bytes(param_bytes, world_size).total
    root = 4 * report["root_params"] if par.reshard_after_forward is None else 0
    return costs.fsdp_step_bytes(param_bytes, world_size, "FULL_SHARD", root_bytes=root).total


def run(timeout: float = 240.0) -> list[dict]:
    gpus = torch.cuda.device_count()
    rows = []
    for ws in world_sizes(gpus):
        for par in (Parallel("ddp"), Parallel("fsdp2")):
            t0 = time.perf_counter()
            reports = launch.spawn(measure.measure_step, par, model_kwargs=GPU_MODEL,
                                   batch_size=32, world_size=ws, backend="nccl",
                                   timeout=timeout, output="rank0")
            r0 = reports[0]
            rows.append({
                "world_size": ws,
                "method": par.label,
                "peak_mib": max(r["peak"].peak for r in reports) / 2**20,
                "step_ms": 1e3 * statistics.median(r0["step_times"]),
                "comm_mib": r0["volume"].total / 2**20,
                "predicted_mib": predicted_bytes(r0, par, ws) / 2**20,
                "launch_s": time.perf_counter() - t0,
            })
    return rows


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("Không tìm thấy GPU nào (torch.cuda.is_available() là False): bỏ qua kiểm tra GPU. "
              "Hãy chạy `make gpu-check` trên máy có GPU NVIDIA và bản PyTorch có CUDA.")
        return 0
    print(launch.describe_mode(torch.cuda.device_count()))
    rows = run()
    header = (f"{'N':>3} {'cách chia':<42} {'peak MiB':>9} {'bước ms':>8} "
              f"{'giao tiếp MiB':>13} {'dự đoán MiB':>11}")
    print(header)
    print("-" * len(header))
    ok = True
    for r in rows:
        match = abs(r["comm_mib"] - r["predicted_mib"]) <= 1e-9 + 1e-6 * r["predicted_mib"]
        ok &= match
        print(f"{r['world_size']:>3} {r['method']:<42} {r['peak_mib']:>9.1f} {r['step_ms']:>8.2f} "
              f"{r['comm_mib']:>13.2f} {r['predicted_mib']:>11.2f}{'' if match else '  ≠'}")
    print("Kết quả: " + ("giao tiếp đo được khớp công thức." if ok else "có dòng không khớp công thức (≠)."))
    print()
    print("Đường chạy GPU của các trang phần 4.2 (NCCL):")
    for row in gpu_pages.run_pages(torch.cuda.device_count()):
        ok &= row["ok"]
        print(f"  {'✓' if row['ok'] else '✗'} {row['page']:<20} {row['seconds']:6.1f} s  {row['detail']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
