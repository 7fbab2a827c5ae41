"""Huấn luyện một MLP nhỏ bằng DDP (mục 4.2.2). PyTorch thuần, chép đi dùng được:
torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 3 --checkpoint ddp.pt"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="số mẫu mỗi bước trên MỖI rank")
    p.add_argument("--checkpoint", default="ddp.pt")
    args = p.parse_args()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])  # torchrun đặt
    if torch.cuda.is_available():  # mỗi process một GPU: cuda:LOCAL_RANK, NCCL
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:  # không có GPU: gloo trên CPU
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        torch.manual_seed(0)  # cùng dữ liệu, cùng trọng số đầu trên mọi rank
        x = torch.randn(4096, 16)
        data = TensorDataset(x, x @ torch.randn(16, 1) + 0.1 * torch.randn(4096, 1))
        sampler = DistributedSampler(data)  # rank r lấy phần r của một hoán vị chung
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
        net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        model = DDP(net.to(device))  # phát trọng số của rank 0 cho mọi rank
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # hoán vị mới mỗi epoch, chung cho mọi rank
            for xb, yb in loader:
                loss = torch.nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
                optimizer.zero_grad()
                loss.backward()  # DDP lấy trung bình gradient qua các rank ngay tại đây
                optimizer.step()
            if rank == 0:  # một rank in và ghi; các rank khác chờ ở barrier
                print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
                os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
                torch.save(model.module.state_dict(), args.checkpoint)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
