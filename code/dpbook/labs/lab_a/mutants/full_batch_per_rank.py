"""Mỗi rank dùng batch BATCH_SIZE thay vì BATCH_SIZE // world_size (global batch gấp N): dữ liệu chia đúng nhưng trọng số khác; mục weights phải bắt (gợi ý nêu BATCH_SIZE // world_size), loss là hệ quả."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from dpbook import vi
from dpbook.labs.lab_a.common import BATCH_SIZE, LR, SEED, build_model, evaluate, make_dataset


def setup() -> tuple[int, int, torch.device]:
    """Join the process group that torchrun describes in the environment; one device each."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    # NCCL only if every process on this node gets its own GPU; otherwise gloo on the CPU.
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return rank, world_size, device


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    rank, world_size, device = setup()
    try:
        if BATCH_SIZE % world_size:
            raise ValueError(f"BATCH_SIZE={BATCH_SIZE} phải chia hết cho world_size={world_size}.")
        model = build_model().to(device)
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        dataset = make_dataset()
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                     shuffle=True, seed=SEED)
        # Per-rank batch: the global batch of the original script, split over the ranks.
        loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)  # SAI

        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            total = 0.0
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()  # DDP averages the gradients of all ranks here
                optimizer.step()
                total += loss.item()
            if rank == 0:  # rank 0's share of the data only (exercise: all ranks' mean)
                print(f"epoch {epoch}: loss = {total / len(loader):.6f}")

        if rank == 0:
            os.makedirs(args.out, exist_ok=True)
            final = evaluate(model.module, dataset)
            torch.save({"state": model.module.state_dict(), "loss": final},
                       os.path.join(args.out, "model.pt"))
            print(f"đã lưu {args.out}/model.pt, giá trị mất mát cuối = {vi.number(final, 6)}")
        dist.barrier()  # nobody leaves (or reads the file) before rank 0 has saved
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
