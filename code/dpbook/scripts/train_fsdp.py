"""Huấn luyện một MLP nhỏ bằng FSDP2 (mục 4.2.3). PyTorch thuần, chép đi dùng được:
torchrun --standalone --nproc_per_node=2 train_fsdp.py --epochs 3 --checkpoint fsdp_ckpt"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="số mẫu mỗi bước trên MỖI rank")
    p.add_argument("--checkpoint", default="fsdp_ckpt", help="thư mục checkpoint DCP")
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
        blocks = [torch.nn.Sequential(torch.nn.Linear(16 if i == 0 else 64, 64), torch.nn.ReLU())
                  for i in range(3)]
        model = torch.nn.Sequential(*blocks, torch.nn.Linear(64, 1)).to(device)
        for block in blocks:
            fully_shard(block)  # mỗi khối một đơn vị: một AllGather riêng
        fully_shard(model)  # gốc: giữ phần còn lại (tầng cuối)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # tạo SAU fully_shard
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # hoán vị mới mỗi epoch, chung cho mọi rank
            for xb, yb in loader:
                loss = torch.nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
                optimizer.zero_grad()
                loss.backward()  # ReduceScatter: mỗi rank nhận trung bình gradient của shard mình
                optimizer.step()
            if rank == 0:
                print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
            model_sd, optim_sd = get_state_dict(model, optimizer)  # từng shard, không gom
            dcp.save({"model": model_sd, "optim": optim_sd},  # mọi rank ghi phần của mình
                     checkpoint_id=os.path.join(args.checkpoint, f"epoch_{epoch}"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
