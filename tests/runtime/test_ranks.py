"""``%ranks`` / ``%%ranks`` in a real Jupyter kernel, as a learner uses them: the issue's example,
a failing rank, a hung collective, an interrupt, bad input, ``%ranks stop``. One kernel for all of
it: each start of the ranks costs seconds. A process that dies without stopping its ranks is
the reaper's test, on plain processes."""

import subprocess
import sys
import time

import psutil
import pytest
from jupyter_client.manager import start_new_kernel

from dpbook import ranks

pytestmark = pytest.mark.distributed


def _run(client, code, timeout=120):
    out, errors = [], []

    def hook(msg):
        kind = msg["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            errors.append("\n".join(msg["content"]["traceback"]))
        elif kind == "execute_result":
            out.append(msg["content"]["data"]["text/plain"] + "\n")

    # stop_on_error=False: ipykernel 7 sends an error's reply before it starts aborting queued
    # requests (kernelbase.execute_request, then _abort_queues), so the next cell, sent as soon
    # as the reply arrives, was sometimes answered 'aborted' on a busy machine.
    reply = client.execute_interactive(code, timeout=timeout, output_hook=hook,
                                       stop_on_error=False)
    return reply["content"]["status"], "".join(out), "\n".join(errors)


def _ok(client, code, timeout=120):
    status, out, err = _run(client, code, timeout)
    assert status == "ok", out + err
    return out


def _alive(pids):
    return [p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _gone_within(pids, seconds):
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _alive(pids)


def test_ranks_in_a_kernel(tmp_path):
    # The ranks run on the CPU (gloo) even on a GPU box (the review's D8): this test is about the
    # magic's behaviour (messages, interrupts, restarts), which a lone NCCL collective would not
    # show (it returns at once); `make gpu-check` runs the pages' %ranks cells under NCCL.
    import os
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    try:
        _ok(kc, "%load_ext dpbook.ranks")
        # Used before start, and bad arguments: Vietnamese messages, the kernel goes on.
        status, _, err = _run(kc, "%%ranks\nprint(1)")
        assert status == "error" and "%ranks start" in err
        status, _, err = _run(kc, "%ranks start hai")
        assert status == "error" and "Không hiểu 'hai'" in err
        status, _, err = _run(kc, "%ranks start 0")
        assert status == "error" and "world_size" in err

        out = _ok(kc, "%ranks start 2")
        assert "backend gloo, 2 process" in out
        first = _ok(kc, "from dpbook import ranks as _r\nprint(_r.current().processes())")
        pids = [int(p) for p in first.strip(" []\n").split(",")]
        assert len(pids) == 3  # the controller and two engines

        # The example: variables live across cells; each line says its rank.
        _ok(kc, "%%ranks\nimport torch, torch.distributed as dist\n"
                "t = torch.ones(2) * (dist.get_rank() + 1)")
        out = _ok(kc, "%%ranks\ndist.all_reduce(t); print(t.tolist())")
        assert out.splitlines() == ["[rank 0] [3.0, 3.0]", "[rank 1] [3.0, 3.0]"]
        assert "[rank 1] Out: 1" in _ok(kc, "%%ranks\nrank")

        # A rank that raises: its traceback, the others' variables kept.
        status, _, err = _run(kc, "%%ranks\nx = 1 / (rank - 1)")
        assert status == "error" and "Rank 1 gặp lỗi" in err and "ZeroDivisionError" in err
        assert "[3.0, 3.0]" in _ok(kc, "%%ranks\nprint(t.tolist())")

        # Interrupt: plain Python on the ranks stops with KeyboardInterrupt, state kept.
        # Each rank marks a file once it sleeps: the interrupt must find both asleep, not still
        # on their way (a fixed wait was a guess on two busy cores).
        asleep = [tmp_path / f"ngu{r}" for r in range(2)]
        msg_id = kc.execute(f"%%ranks\nimport time, pathlib\n"
                            f"pathlib.Path({str(tmp_path)!r}, f'ngu{{rank}}').touch()\n"
                            "time.sleep(60)", stop_on_error=False)
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in asleep):
            assert time.monotonic() < deadline, "các rank không bắt đầu ngủ sau 60 s"
            time.sleep(0.05)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert "[3.0, 3.0]" in _ok(kc, "%%ranks\nprint(t.tolist())")

        status, _, err = _run(kc, "%%ranks --timeout x\nprint(1)")
        assert status == "error" and "--timeout cần một số giây" in err

        # A collective only rank 0 calls: the deadline ends it, the ranks are fresh again.
        status, _, err = _run(kc, "%%ranks --timeout 3\nif rank == 0:\n    dist.all_reduce(t)")
        assert status == "error" and "Quá thời gian chờ 3 s: rank 0" in err and "đã mất" in err
        assert _gone_within(pids, 10) == []  # the stuck engines were replaced, not left
        assert "[rank 1] False" in _ok(kc, "%%ranks\nprint('t' in dir())")

        out = _ok(kc, "print(_r.current().processes())\n%ranks stop")
        pids = [int(p) for p in out.splitlines()[0].strip(" []").split(",")]
        assert "Đã dừng mọi rank." in out
        assert _gone_within(pids, 10) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.fixture
def shell():
    """An IPython shell in this process with the magics loaded: a misuse answered before any
    rank starts needs no kernel."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"  # leaves no history file behind
    sh = InteractiveShell.instance(config=config)
    sh.run_line_magic("load_ext", "dpbook.ranks")
    try:
        yield sh
    finally:
        ranks.stop()
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("line, says", [
    ("%ranks start 0", "world_size phải là số nguyên >= 1"),
    ("%ranks start 2 --backend mpi", "backend='mpi' không hợp lệ"),
    ("%ranks pull x", "hãy gọi %ranks start trước"),
    ("%%ranks\nprint(1)", "hãy gọi %ranks start trước"),
], ids=["start-0", "backend-mpi", "pull", "cell"])
def test_a_misuse_is_one_vietnamese_line(shell, capsys, line, says):
    result = shell.run_cell(line)
    seen = capsys.readouterr()
    text = (seen.out + seen.err).strip()
    assert isinstance(result.error_in_exec, ranks.RanksError), text
    assert "Traceback" not in text and len(text.splitlines()) == 1 and says in text, text
    assert ranks._current is None  # nothing started


def test_a_rank_outputs_are_labelled(capsys):
    outputs = [ranks.RankOutput(0, "a\nb\n", "", "3", None), ranks.RankOutput(1, "c\n", "", None, None)]
    ranks.show(outputs)
    assert capsys.readouterr().out.splitlines() == [
        "[rank 0] a", "[rank 0] b", "[rank 0] Out: 3", "[rank 1] c"]


def test_a_stop_without_a_start_is_harmless():
    r = ranks.Ranks(2, backend="gloo")
    r.stop()
    with pytest.raises(RuntimeError, match="%ranks start"):
        r.run("print(1)")


REAPED = """
import os, signal, subprocess, sys
from dpbook import ranks
kids = [subprocess.Popen(["sleep", "60"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(2)]
reaper = ranks.Reaper()
reaper.watch([k.pid for k in kids])
if sys.argv[1] == "release":
    reaper.release()
print(*[k.pid for k in kids], flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # dies as a crashed kernel does: no atexit, no cleanup
"""


@pytest.mark.parametrize("how", ["crash", "release"])
def test_the_reaper_ends_what_a_dead_process_started(how):
    proc = subprocess.run([sys.executable, "-c", REAPED, how], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    try:
        if how == "crash":
            assert _gone_within(pids, 10) == []
        else:  # a clean stop: the reaper leaves the processes to their owner
            time.sleep(1.5)
            assert _alive(pids) == pids
    finally:
        for p in _alive(pids):
            psutil.Process(p).kill()


def test_pulled_tensors_come_back_on_the_cpu_whatever_device_each_rank_used():
    """The review's D2: under NCCL rank r's tensors sit on cuda:r; adding or comparing two pulled
    tensors then mixes devices. ``FakeTensorMode`` stands for the two GPUs without any CUDA."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dpbook.ranks import on_cpu

    with FakeTensorMode(allow_non_fake_inputs=True):
        pulled = [torch.ones(2, device="cuda:0"), {"t": torch.ones(2, device="cuda:1"), "n": 3}]
        with pytest.raises(Exception, match="(?i)device"):
            pulled[0] + pulled[1]["t"]  # what a page did with `%ranks pull` before
        moved = on_cpu(pulled)
        assert moved[0].device.type == moved[1]["t"].device.type == "cpu" and moved[1]["n"] == 3
        assert (moved[0] + moved[1]["t"]).device.type == "cpu"
