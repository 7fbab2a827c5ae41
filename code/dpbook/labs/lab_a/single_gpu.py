"""Bài A, script gốc: huấn luyện một MLP nhỏ trên MỘT thiết bị (một GPU, hoặc CPU).

Chạy:  python single_gpu.py --out DIR [--epochs 3]
Kết quả: DIR/model.pt chứa {"state": trọng số cuối,
                             "loss": giá trị mất mát cuối trên toàn bộ dữ liệu}.
"""

import argparse
import os

import torch
from torch.utils.data import DataLoader

from dpbook import vi
from dpbook.labs.lab_a.common import BATCH_SIZE, LR, SEED, build_model, evaluate, make_dataset


def epoch_order(n: int, epoch: int) -> list[int]:
    """A fresh shuffle each epoch, drawn from SEED + epoch (the rule DistributedSampler uses)."""
    g = torch.Generator().manual_seed(SEED + epoch)
    return torch.randperm(n, generator=g).tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    dataset = make_dataset()

    for epoch in range(args.epochs):
        order = epoch_order(len(dataset), epoch)
        loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=order)
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: loss = {total / len(loader):.6f}")

    os.makedirs(args.out, exist_ok=True)
    final = evaluate(model, dataset)
    torch.save({"state": model.state_dict(), "loss": final},
               os.path.join(args.out, "model.pt"))
    print(f"đã lưu {args.out}/model.pt, giá trị mất mát cuối = {vi.number(final, 6)}")


if __name__ == "__main__":
    main()
