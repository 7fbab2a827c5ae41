"""HYBRID_SHARD across (emulated) nodes, as a torchrun target (section 4.2.4).

``torchrun --nnodes=2 --nproc_per_node=2 ... -m dpbook.scripts.hsdp_script OUT_DIR`` (both
agents on one machine or on two: ``torchrun.worker.init_from_env`` tells them apart) runs, in each
worker: join the process group from torchrun's variables; for each method (FSDP2 ``fully_shard``
on a 2-D mesh, FSDP1 ``HYBRID_SHARD``), shard the chapter's MLP inside each node and replicate
it across nodes, train it a few steps (float64), and record the collectives of one more step
(float32) together with the ranks of the process group each one ran in. Rank 0 gathers every
worker's summary, saves the final weights to ``OUT_DIR`` and prints one JSON line tagged ``TAG``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from .. import torchrun
from ..checks import int_at_least, one_of
from ..data import rank_batch, synthetic_regression
from ..measure import CommLog, bytes_by_group
from ..models import Block, build_mlp, num_params
from ..torchrun.worker import process_group, read_env
from ..train import Parallel, build_model, fit, train_step
from ._cli import vietnamese_parser

TAG = "DPBOOK_HSDP"
METHODS = ("fsdp2", "fsdp1")
STATE_FILE = "hsdp_{method}.pt"


def parallel(method: str, shard_size: int) -> Parallel:
    """Hybrid sharding with ``shard_size`` ranks per shard group, in FSDP2 or FSDP1 terms."""
    one_of("method", method, METHODS)
    if method == "fsdp2":
        return Parallel("fsdp2", shard_size=shard_size)
    return Parallel("fsdp1", strategy="HYBRID_SHARD", shard_size=shard_size)


def step_traffic(rank: int, world_size: int, par: Parallel, batch_size: int) -> dict:
    """The collectives of one float32 training step (after a warm-up step), each as
    ``[collective, phase, full tensor bytes, bytes this rank sends, group ranks]``, and their
    ``StepVolume`` (bytes sent, summed per collective and pass)."""
    model, wrapped = build_model(par, world_size, dtype=torch.float32)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    ds = synthetic_regression(batch_size * world_size, model.blocks[0].linear.in_features,
                              model.head.out_features)
    dev = next(wrapped.parameters()).device
    x, y = rank_batch(ds.tensors, rank, batch_size, dev)
    train_step(wrapped, optimizer, x, y)  # warm-up: lazy initialisation happens here
    with CommLog() as log:
        train_step(wrapped, optimizer, x, y)
    records = [[r.collective, r.phase, r.nbytes, r.sent_bytes, list(r.group_ranks)]
               for r in log.records]
    return {"records": records, "volume": dataclasses.asdict(log.volume())}


def traffic_by_group(records: list) -> dict[tuple[int, ...], dict[str, float]]:
    """Bytes this rank sent in one step, per process group (its global ranks) and collective,
    from the ``records`` of ``step_traffic``."""
    return bytes_by_group((group, collective, sent)
                          for collective, _phase, _nbytes, sent, group in records)


def single_process_reference(summary: dict) -> dict[str, torch.Tensor]:
    """The weights one process reaches on the same global batches as the run that printed
    ``summary`` (each of its ``world_size`` ranks trained on ``batch_size`` samples a step)."""
    ref = fit(0, 1, None, steps=summary["steps"],
              batch_size=summary["world_size"] * summary["batch_size"])
    return ref["state"]


def max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys."""
    return max((a[k] - b[k]).abs().max().item() for k in a)


def run_method(method: str, env: dict, steps: int, batch_size: int, out_dir: str) -> dict:
    """Train and measure one method on this rank; rank 0 saves the final weights. Returns this
    rank's summary: losses, the traffic of one step, and how far its final weights are from
    rank 0's (they should be equal: every rank gathers the same full parameters)."""
    rank, world = env["RANK"], env["WORLD_SIZE"]
    par = parallel(method, env["LOCAL_WORLD_SIZE"])  # one shard group per node
    trained = fit(rank, world, par, steps=steps, batch_size=batch_size, dtype=torch.float64)
    shared = [trained["state"] if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)  # rank 0's weights, to compare with
    if rank == 0:  # only rank 0 writes, so only its node needs out_dir: created if missing
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        torch.save(trained["state"], Path(out_dir) / STATE_FILE.format(method=method))
    return {"rank": rank, "local_rank": env["LOCAL_RANK"], "group_rank": env["GROUP_RANK"],
            "losses": trained["losses"], "gap_to_rank0": max_gap(trained["state"], shared[0]),
            **step_traffic(rank, world, par, batch_size)}


def model_sizes() -> dict:
    """Parameters of the chapter's MLP, in all and in the root module (no ``Block`` owns them:
    the root keeps them unsharded from forward to backward)."""
    model = build_mlp()
    in_blocks = sum(p.numel() for m in model.modules() if isinstance(m, Block)
                    for p in m.parameters())
    total = num_params(model)
    return {"num_params": total, "root_params": total - in_blocks}


def run(methods: Sequence[str], steps: int, batch_size: int, out_dir: str) -> dict | None:
    """Every method on this rank; rank 0 returns what every rank found, the others ``None``."""
    env = read_env()
    summaries = {m: run_method(m, env, steps, batch_size, out_dir) for m in methods}
    gathered = [None] * env["WORLD_SIZE"]
    dist.all_gather_object(gathered, summaries)
    if env["RANK"] != 0:
        return None
    return {"world_size": env["WORLD_SIZE"], "local_world_size": env["LOCAL_WORLD_SIZE"],
            "backend": dist.get_backend(), "steps": steps, "batch_size": batch_size,
            **model_sizes(), "methods": {m: [g[m] for g in gathered] for m in methods}}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (help in Vietnamese)."""
    p = vietnamese_parser(prog="torchrun ... -m dpbook.scripts.hsdp_script",
                          description="HYBRID_SHARD giữa các node (mục 4.2.4).")
    p.add_argument("out_dir", help="thư mục rank 0 lưu trọng số cuối")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="fsdp2 (fully_shard trên mesh 2 chiều) và/hoặc fsdp1 (HYBRID_SHARD)")
    p.add_argument("--steps", type=int, default=3, help="số bước huấn luyện")
    p.add_argument("--batch-size", type=int, default=4, help="số mẫu mỗi bước trên MỖI rank")
    args = p.parse_args(argv)
    try:
        int_at_least("steps", args.steps)
        int_at_least("batch_size", args.batch_size)
    except ValueError as err:
        p.error(str(err))
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        p.error(f"out_dir là một file, không phải thư mục: {args.out_dir!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point under torchrun: join, run, rank 0 prints one JSON line, always leave."""
    args = parse_args(argv)
    with process_group():
        summary = run(args.methods, args.steps, args.batch_size, args.out_dir)
        if summary is not None:
            torchrun.emit(TAG, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
