"""What ``torchrun`` tells each worker (section 4.2.4), as a torchrun target.

``torchrun --nnodes=2 --nproc_per_node=2 ... -m dpbook.scripts.torchrun_env`` starts workers
that join one process group from the variables ``torchrun`` set (``torchrun.worker``), check it
with one AllReduce and print one JSON line each, tagged ``TAG``: the variables, the host, the
process id, the backend and the device. Both agents may run on one machine (two terminals, emulated
nodes): the workers find that out through the agent's store and share the GPUs without
collision, no variable needed. ``dpbook.torchrun.json_records`` reads those lines back from
the agents' outputs, and ``layout_problems`` checks the rank arithmetic they must obey.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from .. import torchrun
from ..torchrun.worker import host_ranks_seen, process_group, read_env

TAG = "DPBOOK_ENV"
def report(dev: torch.device) -> dict:
    """This worker's torchrun variables, host, pid, backend, device, the ranks found on its
    machine (``None`` without the agent's store), and the result of an AllReduce of
    ``rank + 1`` over the whole group (``W(W+1)/2`` if everyone joined)."""
    t = torch.tensor([dist.get_rank() + 1.0], device=dev)
    dist.all_reduce(t)
    return {**read_env(), "hostname": socket.gethostname(), "pid": os.getpid(),
            "backend": dist.get_backend(), "device": str(dev), "allreduce_sum": t.item(),
            "host_ranks": host_ranks_seen()}


def layout_problems(reports: list[dict]) -> list[str]:
    """What is wrong, in Vietnamese, with the reports of one run (``[]`` when nothing is).

    Every worker must see the same ``WORLD_SIZE``; ranks must be ``0 .. W-1`` once each;
    ``RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``; the workers of one agent (``agent``
    key, added by ``torchrun.json_records``) share one ``GROUP_RANK``, distinct agents differ.
    """
    problems = []
    worlds = {r["WORLD_SIZE"] for r in reports}
    if worlds != {len(reports)}:
        problems.append(f"WORLD_SIZE {sorted(worlds)} khác số worker đã báo ({len(reports)}).")
    if sorted(r["RANK"] for r in reports) != list(range(len(reports))):
        problems.append("Các RANK không phải 0..W-1, mỗi số đúng một lần.")
    for r in reports:
        expected = r["GROUP_RANK"] * r["LOCAL_WORLD_SIZE"] + r["LOCAL_RANK"]
        if r["RANK"] != expected:
            problems.append(f"RANK {r['RANK']} khác GROUP_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK "
                            f"= {expected}.")
    by_agent: dict[int, set[int]] = {}
    for r in reports:
        by_agent.setdefault(r.get("agent", r["GROUP_RANK"]), set()).add(r["GROUP_RANK"])
    if any(len(g) != 1 for g in by_agent.values()):
        problems.append("Các worker của cùng một agent mang GROUP_RANK khác nhau.")
    elif len({next(iter(g)) for g in by_agent.values()}) != len(by_agent):
        problems.append("Hai agent (hai node) mang cùng một GROUP_RANK.")
    return problems


def main() -> int:
    """Entry point under torchrun: join, report one JSON line, always leave the group."""
    with process_group() as dev:
        torchrun.emit(TAG, report(dev))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
