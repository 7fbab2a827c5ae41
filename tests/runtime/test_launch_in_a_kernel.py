"""In a real Jupyter kernel: a function defined in a cell runs on 2 ranks; a hung launch times
out, no rank survives, the next cell works."""

import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = pytest.mark.distributed

HANG = """
from dpbook import launch, workers
try:
    launch.spawn(workers.hang_on_rank, world_size=2, backend="gloo", timeout=5)
except TimeoutError as err:
    print("TIMEOUT", err)
"""
CHECK = """
import psutil
ranks = [c for c in psutil.Process().children(recursive=True)
         if c.name().startswith(launch.RANK_NAME) and c.status() != psutil.STATUS_ZOMBIE]
print("ORPHANS", len(ranks))
print("AGAIN", launch.spawn(workers.all_reduce_rank_ids, world_size=2, backend="gloo")[1]["received"])
launch.spawn(workers.say_hello, world_size=2, backend="gloo")
"""

# Two cells, as a learner writes them: a global in one, a function that reads it in the next.
DEFINE = """
import torch, torch.distributed as dist
from dpbook import launch
SCALE = 1.0
"""
MINE = """
def my_all_reduce(rank, world_size):
    t = torch.ones(2) * (dist.get_rank() + 1) * SCALE
    dist.all_reduce(t)
    print("rank", rank, "có", t.tolist())
    return t.tolist()

print("RESULTS", launch.spawn(my_all_reduce, world_size=2, backend="gloo"))
"""


def _run(client, code):
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("ERROR " + msg["content"]["ename"])

    reply = client.execute_interactive(code, timeout=120, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)


def test_a_function_defined_in_a_cell_runs_on_every_rank():
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        _run(kc, DEFINE)
        out = _run(kc, MINE)
        assert "RESULTS [[3.0, 3.0], [3.0, 3.0]]" in out
        assert "rank 0 có [3.0, 3.0]" in out and "[rank 1] rank 1 có [3.0, 3.0]" in out
        assert "__main__" in _run(kc, "print(my_all_reduce.__module__)")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_kernel_survives_a_hang():
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        assert "TIMEOUT" in _run(kc, HANG)
        out = _run(kc, CHECK)
        assert "ORPHANS 0" in out and "AGAIN [3.0, 3.0, 3.0, 3.0]" in out
        # the ranks' prints reach the cell that launched them, rank 1's prefixed
        assert "xin chào từ rank 0/2" in out and "[rank 1] xin chào từ rank 1/2" in out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
