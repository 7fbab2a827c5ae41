"""The launcher: results, output, errors, hangs, parallel launches, no orphans."""

import threading
import time

import psutil
import pytest
import torch

from dpbook import launch, workers

pytestmark = pytest.mark.distributed


def _rank_processes():
    """Live children of this process that are spawned ranks (not the resource tracker)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def test_plan_on_this_machine():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    p = launch.plan()
    assert p.world_size == (gpus if gpus >= 2 else 2)
    assert p.backend == ("nccl" if gpus >= p.world_size else "gloo")
    sentence = launch.describe_mode()
    assert sentence.startswith("Chế độ") and p.backend.upper()[:4] in sentence.upper()


def test_plan_refuses_bad_requests():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"{gpus + 1} GPU.*{gpus}"):
        launch.plan(gpus + 1, backend="nccl")
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="world_size"):
            launch.plan(bad)
    with pytest.raises(ValueError, match="backend"):
        launch.plan(2, backend="mpi")


def test_results_in_rank_order():
    res = launch.spawn(workers.all_reduce_rank_ids, world_size=3, numel=2, backend="gloo")
    assert [r["rank"] for r in res] == [0, 1, 2]
    assert all(r["received"] == [6.0, 6.0] for r in res)


def test_output_prefix_and_rank0(capsys):
    launch.spawn(workers.say_hello, world_size=2, backend="gloo")
    out = capsys.readouterr().out.splitlines()
    assert "xin chào từ rank 0/2" in out and "[rank 1] xin chào từ rank 1/2" in out
    launch.spawn(workers.say_hello, world_size=2, backend="gloo", output="rank0")
    out = capsys.readouterr().out
    assert "xin chào từ rank 0/2" in out and "rank 1/2" not in out
    launch.spawn(workers.say_hello, world_size=2, backend="gloo", output="none")
    assert capsys.readouterr().out == ""


def test_notebook_functions_are_refused_before_starting():
    def local(rank, world_size):
        return rank

    before = len(_rank_processes())
    for fn in (local, lambda r, w: r):
        with pytest.raises(ValueError, match="pickle"):
            launch.spawn(fn)
    assert len(_rank_processes()) == before
    main_fn = type(local)(local.__code__, {"__name__": "__main__"}, "worker")
    main_fn.__module__ = "__main__"
    with pytest.raises(ValueError, match="__main__"):
        launch.spawn(main_fn)


def test_a_failing_rank_is_named_and_the_others_stop():
    t0 = time.monotonic()
    with pytest.raises(launch.RankError) as info:
        launch.spawn(workers.fail_on_rank, world_size=3, backend="gloo", timeout=60, bad_rank=1)
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "lỗi cố ý ở rank 1" in str(err) and "fail_on_rank" in err.remote_traceback
    # ranks 0 and 2 were blocked in a barrier: they must have been terminated, not awaited
    assert time.monotonic() - t0 < 30
    assert _rank_processes() == []


def test_a_rank_that_dies_silently_is_reported():
    with pytest.raises(launch.RankError, match="mã thoát 3"):
        launch.spawn(workers.exit_abruptly, world_size=2, backend="gloo", timeout=60)
    assert _rank_processes() == []


def test_a_hang_times_out_and_leaves_no_orphans():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank 0, 1"):
        launch.spawn(workers.hang_on_rank, world_size=2, backend="gloo", timeout=6)
    assert time.monotonic() - t0 < 6 + 15  # timeout + start-up + termination grace
    assert _rank_processes() == []
    # the caller is still usable
    assert launch.spawn(workers.child_pid, world_size=2, backend="gloo")[0] > 0


def test_parallel_launches_do_not_collide():
    results, errors = [], []

    def one():
        try:
            results.append(launch.spawn(workers.all_reduce_rank_ids, world_size=2, backend="gloo"))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(results) == 3
    assert all(r[1]["received"] == [3.0] * 4 for r in results)


@pytest.mark.parametrize("kwargs", [dict(timeout=0), dict(timeout="1"), dict(output="all")])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        launch.spawn(workers.child_pid, world_size=2, **kwargs)
