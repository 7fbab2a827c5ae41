"""The launcher: results, output, errors, hangs, parallel launches, no orphans."""

import pathlib
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
            if child.name().startswith(launch.RANK_NAME) and child.status() != psutil.STATUS_ZOMBIE:
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


def test_functions_no_child_can_import_run_by_value():
    scale = 10

    def local(rank, world_size):
        t = torch.ones(2) * (rank + 1) * scale  # a closure variable travels with the function
        torch.distributed.all_reduce(t)
        return t.tolist()

    assert launch.spawn(local, world_size=2, backend="gloo") == [[30.0, 30.0]] * 2
    assert launch.spawn(lambda r, w: (r, w), world_size=2, backend="gloo") == [(0, 2), (1, 2)]
    # what a notebook cell defines: a function of module __main__
    main_fn = type(local)(workers.say_hello.__code__, {"__name__": "__main__", "print": print},
                          "worker")
    main_fn.__module__ = "__main__"
    assert not launch.importable(main_fn) and not launch.importable(local)
    assert launch.spawn(main_fn, world_size=2, backend="gloo", output="none") == [0, 1]
    with pytest.raises(ValueError, match="module __main__"):
        launch.check_importable(main_fn)  # what torch.multiprocessing.spawn would need


def test_importable_functions_still_go_by_name():
    fn, args, kwargs = launch.pack(workers.all_reduce_rank_ids, (), {"numel": 2})
    assert fn is workers.all_reduce_rank_ids and kwargs == {"numel": 2}
    launch.check_importable(workers.all_reduce_rank_ids)
    # an argument that refers to code no child can import sends everything by value
    packed, args, kwargs = launch.pack(workers.identity, (), {"names": lambda: 1})
    assert type(packed).__name__ == "_ByValue" and (args, kwargs) == ((), {})
    assert packed.load()[0] is workers.identity  # by value, yet the library function by name


def test_what_cannot_be_serialised_is_refused_before_any_process_starts(tmp_path):
    lock = threading.Lock()

    def with_lock(rank, world_size):
        with lock:
            return rank

    before = len(_rank_processes())
    with pytest.raises(ValueError, match=r"biến 'lock' mà hàm giữ trong closure \(kiểu lock"):
        launch.spawn(with_lock, world_size=2, backend="gloo")
    with open(tmp_path / "log.txt", "w") as f, pytest.raises(ValueError, match="TextIOWrapper"):
        launch.spawn(lambda r, w: f.write("x"), world_size=2, backend="gloo")
    # an importable function with an argument pickle refuses: the same message, by name
    with pytest.raises(ValueError, match=r"đối số 'names' \(kiểu lock.*Cách sửa"):
        launch.spawn(workers.identity, world_size=2, backend="gloo", names=threading.Lock())
    assert len(_rank_processes()) == before
    with pytest.raises(TypeError, match="fn phải là một hàm"):
        launch.spawn(42, world_size=2)


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


def test_what_a_rank_writes_below_python_reaches_its_error():
    # NCCL's watchdog reports a timeout from C++ on fd 2, then aborts the process: the caller
    # must still see that line (in Jupyter fd 2 goes to the server's terminal, not the cell).
    with pytest.raises(launch.RankError, match="SIGABRT") as info:
        launch.spawn(workers.abort_below_python, world_size=2, backend="gloo", timeout=60)
    assert info.value.rank == 1
    assert workers.NATIVE_MESSAGE in info.value.native_output
    assert workers.NATIVE_MESSAGE in str(info.value)
    assert _rank_processes() == []


def test_a_cpu_rank_that_touched_cuda_fails_when_asked(monkeypatch):
    assert launch.spawn(workers.touch_cuda_as_a_bug_would, world_size=2, backend="gloo",
                        timeout=60) == [0, 1]
    monkeypatch.setenv(launch.NO_CUDA_VAR, "1")
    with pytest.raises(launch.RankError, match="đã khởi tạo CUDA"):
        launch.spawn(workers.touch_cuda_as_a_bug_would, world_size=2, backend="gloo", timeout=60)
    assert launch.spawn(workers.say_hello, world_size=2, backend="gloo", timeout=60,
                        output="none") == [0, 1]


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


def test_ranks_fork_from_a_forkserver_named_and_with_the_callers_environment(monkeypatch):
    import os

    assert launch.context().get_start_method() == "forkserver"
    launch.spawn(workers.child_pid, world_size=2, backend="gloo")  # the forkserver is running
    monkeypatch.setenv("DPBOOK_SET_AFTER_START", "có dấu")
    res = launch.spawn(workers.identity, world_size=2, backend="gloo",
                       names=("DPBOOK_SET_AFTER_START", "TORCH_DIST_INIT_BARRIER", "RANK"))
    assert [r["comm"] for r in res] == [f"{launch.RANK_NAME}0", f"{launch.RANK_NAME}1"]
    assert all(r["ppid"] != os.getpid() for r in res)  # forked by the forkserver, not by us
    assert [r["env"] for r in res] == [
        {"DPBOOK_SET_AFTER_START": "có dấu", "TORCH_DIST_INIT_BARRIER": "1", "RANK": str(r)}
        for r in range(2)]


# Not `from conftest import ROOT`: with a conftest.py in tests/labs too, whichever one pytest
# imported first is the module named "conftest" (a fresh-clone make test failed on it).
ROOT = pathlib.Path(__file__).resolve().parents[2]
_SCRIPT_HEAD = "import sys\nsys.path.insert(0, {code!r})\nfrom dpbook import launch, workers\n"


def _run_script(tmp_path, body: str, timeout: float = 120):
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(_SCRIPT_HEAD.format(code=str(ROOT / "code")) + body, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


def test_a_script_without_main_guard_is_refused_with_the_fix(tmp_path):
    run = _run_script(tmp_path, "launch.spawn(workers.say_hello, world_size=2)\n")
    assert run.returncode == 1
    assert "ngoài khối `if __name__ == \"__main__\":`" in run.stderr
    assert "script.py, dòng 4" in run.stderr and "Cách sửa" in run.stderr
    ok = _run_script(tmp_path, "if __name__ == '__main__':\n"
                               "    print(launch.spawn(workers.say_hello, world_size=2))\n")
    assert ok.returncode == 0 and "[0, 1]" in ok.stdout, ok.stderr


def test_a_rank_that_dies_while_starting_is_told_apart(tmp_path):
    run = _run_script(tmp_path, "if __name__ == '__mp_main__':  # a child re-importing us\n"
                                "    raise SystemExit(7)\n"
                                "if __name__ == '__main__':\n"
                                "    launch.spawn(workers.say_hello, world_size=2)\n")
    assert run.returncode == 1
    assert "ngay khi khởi động, trước khi chạy hàm" in run.stderr, run.stderr


def test_killing_the_caller_kills_its_ranks(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "caller.py"
    script.write_text(_SCRIPT_HEAD.format(code=str(ROOT / "code")) + (
        "if __name__ == '__main__':\n"
        "    launch.spawn(workers.hang_on_rank, world_size=2, backend='gloo', timeout=300)\n"),
        encoding="utf-8")
    caller = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        ranks: list = []
        deadline = time.monotonic() + 60
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            ranks = [p for p in psutil.Process(caller.pid).children(recursive=True)
                     if p.name().startswith(launch.RANK_NAME)]
        assert len(ranks) == 2, "the ranks did not start"
        everything = psutil.Process(caller.pid).children(recursive=True)
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait(10)
        gone, alive = psutil.wait_procs(everything, timeout=10)
        assert alive == [], f"still alive after the caller died: {alive}"
    finally:
        if caller.poll() is None:
            caller.kill()


def test_the_watchdog_line_survives_a_long_stack_dump(tmp_path):
    """Review D19: NCCL's watchdog line, then 30 lines of frames; the RankError's native output
    (the last lines) must still say what happened."""
    from dpbook import launch

    log = tmp_path / "native.log"
    log.write_text("[rank0]:[E] Watchdog caught collective operation timeout: WorkNCCL(...)\n"
                   + "".join(f"frame #{i}: 0x{i:08x} in libtorch_cuda.so\n" for i in range(30)),
                   encoding="utf-8")
    tail = launch._tail(str(log))
    assert tail.splitlines()[0].startswith("[rank0]:[E] Watchdog caught")
    assert tail.splitlines()[-1] == "frame #29: 0x0000001d in libtorch_cuda.so"
    assert len(tail.splitlines()) == launch._NATIVE_LINES + 2
