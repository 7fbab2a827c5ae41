"""``make gpu-check`` on a machine without GPU exits cleanly and says why."""

import subprocess
import sys

import pytest
import torch

from dpbook.tools import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="máy có GPU: lệnh sẽ chạy thật")
def test_without_gpu_it_says_so_and_exits_zero():
    proc = subprocess.run([sys.executable, "-m", "dpbook.tools.gpu_check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0
    assert "Không tìm thấy GPU" in proc.stdout


def test_world_sizes_cover_powers_of_two_and_the_gpu_count():
    assert gpu_check.world_sizes(1) == [1]
    assert gpu_check.world_sizes(3) == [1, 2, 3]
    assert gpu_check.world_sizes(8) == [1, 2, 4, 8]
    assert gpu_check.world_sizes(6) == [1, 2, 4, 6]


def test_page_checks_run_on_the_largest_power_of_two_of_gpus():
    assert [gpu_check.largest_power_of_two(n) for n in (1, 2, 3, 4, 6, 8)] == [1, 2, 2, 4, 4, 8]


def test_fallbacks_are_the_modes_a_gpu_box_takes_when_ranks_outnumber_gpus():
    assert gpu_check.FALLBACKS == ((1, 2), (2, 4))
    assert all(ranks > visible for visible, ranks in gpu_check.FALLBACKS)


def test_a_peak_ordering_that_breaks_the_pages_claim_is_reported():
    rows = [{"world_size": 1, "method": "DDP", "peak_mib": 10.0},
            {"world_size": 1, "method": "FSDP2 reshard_after_forward=None", "peak_mib": 12.0},
            {"world_size": 2, "method": "DDP", "peak_mib": 10.0},
            {"world_size": 2, "method": "FSDP2 reshard_after_forward=None", "peak_mib": 6.0},
            {"world_size": 4, "method": "DDP", "peak_mib": 10.0},
            {"world_size": 4, "method": "FSDP2 reshard_after_forward=None", "peak_mib": 10.5}]
    assert gpu_check.peak_problems(rows) == ["N = 4: FSDP2 10,5 MiB ≥ DDP 10,0 MiB"]


def test_the_environment_report_names_a_t4_the_wheel_cannot_run():
    from dpbook.tools.machine import Gpu, Machine, built_for

    def t4x2(arch):
        gpus = tuple(Gpu(i, "Tesla T4", (7, 5), 16 * 2**30, built_for((7, 5), arch))
                     for i in range(2))
        return Machine(4, 32 * 2**30, 2**30, "2.13.0", "12.6", arch, gpus, "2.27.3",
                       {(0, 1): False, (1, 0): False}, "Kaggle")

    lines = gpu_check.environment(t4x2(("sm_80", "sm_90")))
    assert lines[0] == "torch 2.13.0, CUDA 12.6, NCCL 2.27.3"
    assert "sm_80 sm_90" in lines[1]
    assert "cuda:1 Tesla T4: sm_75 (KHÔNG có trong bản torch này)" in lines[3]
    assert "fp16 + GradScaler" in lines[3]
    assert lines[4].startswith("P2P") and "không" in lines[4]
    assert "KHÔNG" not in gpu_check.environment(t4x2(("sm_75", "sm_80")))[2]


def test_the_environment_report_probes_this_machine_when_given_none():
    lines = gpu_check.environment()
    assert lines[0].startswith(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL ")


def test_fallback_children_see_fewer_gpus_and_forbid_cuda_on_cpu_ranks(monkeypatch):
    seen = {}

    def fake_run(cmd, env, **kwargs):
        seen.update(cmd=cmd, env=env)
        return subprocess.CompletedProcess(cmd, 0, "  ✓ trang\n", "")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    assert gpu_check.fallback(2, 4)
    assert seen["cmd"][-2:] == ["--fallback", "4"]
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert seen["env"][gpu_check.launch.NO_CUDA_VAR] == "1"


def _fake_hang(dump_entries, calls):
    """A stand-in for ``launch.spawn`` running ``nccl_hang``: records how it was called, writes
    rank 0's dump where the watchdog would (``entries``: None writes none), then fails as the
    aborted job does."""
    import pickle

    def spawn(fn, prefix, hang_timeout, **kwargs):
        import os

        env = {k: os.environ.get(k) for k in ("TORCH_NCCL_TRACE_BUFFER_SIZE",
                                              "TORCH_NCCL_DUMP_ON_TIMEOUT",
                                              "TORCH_NCCL_ENABLE_MONITORING",
                                              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")}
        calls.append({"fn": fn.__name__, "prefix": prefix, "hang_timeout": hang_timeout,
                      "env": env, **kwargs})
        if dump_entries is not None:
            with open(prefix + "0", "wb") as f:
                pickle.dump({"entries": dump_entries}, f)
        raise gpu_check.launch.RankError(0, "ProcessExited", "tín hiệu SIGABRT", "")

    return spawn


def gpu_check_env(prefix):
    from dpbook.pages import modern_ddp

    return modern_ddp.flight_recorder_env(prefix)


def test_the_flight_recorder_check_wants_rank_0s_dump_of_the_stuck_all_reduce(monkeypatch, capsys):
    calls = []
    stuck = [{"profiling_name": "nccl:all_reduce", "collective_seq_id": k, "state": s}
             for k, s in ((1, "completed"), (2, "completed"), (3, "scheduled"))]
    monkeypatch.setattr(gpu_check.launch, "spawn", _fake_hang(stuck, calls))
    assert gpu_check.flight_recorder()
    (call,) = calls
    assert call["fn"] == "nccl_hang" and call["backend"] == "nccl"
    assert call["world_size"] == gpu_check.FLIGHT_RECORDER_GPUS == 2
    assert call["hang_timeout"] == gpu_check.HANG_TIMEOUT_S < call["timeout"]
    assert call["prefix"].endswith("nccl_trace_rank_")
    # the recorder's variables reach the ranks through the caller's environment, then go away
    assert call["env"] == gpu_check_env(call["prefix"])
    import os
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in os.environ
    assert "✓ nccl_trace_rank_0: 3 mục, mục cuối nccl:all_reduce (SeqNum 3, scheduled)" in (
        capsys.readouterr().out)


def test_the_flight_recorder_check_fails_without_a_dump_or_a_hang(monkeypatch):
    monkeypatch.setattr(gpu_check.launch, "spawn", _fake_hang(None, []))
    assert not gpu_check.flight_recorder()
    done = [{"profiling_name": "nccl:all_reduce", "collective_seq_id": 1, "state": "completed"}]
    monkeypatch.setattr(gpu_check.launch, "spawn", _fake_hang(done, []))
    assert not gpu_check.flight_recorder()
    monkeypatch.setattr(gpu_check.launch, "spawn", lambda *a, **k: [None, None])  # no hang at all
    assert not gpu_check.flight_recorder()


@pytest.mark.parametrize("gpus", [1, 2])
def test_main_ends_with_a_table_to_paste_and_fails_on_any_failed_row(monkeypatch, capsys, gpus):
    """The whole run with every step faked: the flight recorder only from 2 GPUs, the bus
    bandwidth timed from 2, and one failed notebook cell makes a row of the table and exit 1."""
    calls = []
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(gpu_check, "environment", lambda: ["máy giả"])
    monkeypatch.setattr(gpu_check.launch, "describe_mode", lambda n: f"{n} GPU")
    row = {"world_size": 1, "method": "DDP", "peak_mib": 2.0, "step_ms": 1.0, "comm_mib": 0.0,
           "predicted_mib": 0.0, "launch_s": 1.0}
    monkeypatch.setattr(gpu_check, "run", lambda: [row])
    monkeypatch.setattr(gpu_check, "bus_bandwidth",
                        lambda ws: calls.append(("busbw", ws)) or (True, "busbw 1 GB/s"))
    monkeypatch.setattr(gpu_check.gpu_pages, "run_pages", lambda w, backend: [
        {"page": "4.2.1 giao tiếp", "ok": True, "detail": "ổn", "seconds": 1.0}])
    monkeypatch.setattr(gpu_check, "fallback", lambda v, r: calls.append(("fallback", v)) or True)
    monkeypatch.setattr(gpu_check, "flight_recorder", lambda: calls.append(("fr",)) or True)
    monkeypatch.setattr(gpu_check, "memcheck_rows", lambda g: [("memcheck", True, "")])
    monkeypatch.setattr(gpu_check, "notebooks", lambda jobs: [
        ("nbval, mọi notebook", False, "9 ô đạt, 1 ô trượt"),
        ("nbval book/x.ipynb::Cell 3", False, "AssertionError")])
    assert gpu_check.main([]) == 1
    out = capsys.readouterr().out
    assert "| kiểm tra | kết quả | chi tiết |" in out
    assert "| nbval book/x.ipynb::Cell 3 | **TRƯỢT** | AssertionError |" in out
    assert f"| Trang 4.2.1 giao tiếp (NCCL, {gpus} rank) | đạt | ổn |" in out
    assert (("fr",) in calls) == (gpus >= 2) and (("busbw", 2) in calls) == (gpus >= 2)


def fake_nvidia_smi(tmp_path, lines):
    """An ``nvidia-smi`` on PATH that lists GPUs as the driver would."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines), encoding="utf-8")
    exe.chmod(0o755)
    return f"{tmp_path}:{__import__('os').environ['PATH']}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="máy có GPU: lệnh sẽ chạy thật")
def test_gpus_the_driver_shows_but_torch_cannot_use_fail_with_the_build_to_install(tmp_path):
    """The review's D14: a CUDA 13 wheel on a driver older than 580 sees no GPU. Here torch is a
    CPU build, so the driver's GPUs are unusable whatever its version: exit 1, name the fix."""
    path = fake_nvidia_smi(tmp_path, ["Tesla T4, 550.54.15", "Tesla T4, 550.54.15"])
    proc = subprocess.run([sys.executable, "-m", "dpbook.tools.gpu_check"], capture_output=True,
                          text=True, timeout=120, env={**__import__("os").environ, "PATH": path})
    assert proc.returncode == 1, proc.stdout
    assert "nvidia-smi thấy 2 GPU (Tesla T4, Tesla T4; driver 550.54.15)" in proc.stdout
    assert "make setup TORCH=cu126" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="máy có GPU: lệnh sẽ chạy thật")
def test_a_fallback_child_that_sees_no_gpu_fails():
    proc = subprocess.run([sys.executable, "-m", "dpbook.tools.gpu_check", "--fallback", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "không thấy GPU nào" in proc.stdout


def test_fallbacks_slice_the_gpus_this_job_was_given():
    assert gpu_check.visible_devices(2, {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == "4,5"
    assert gpu_check.visible_devices(1, {}) == "0"


def test_memcheck_rows_want_the_bucket_copy_diagnosed_only_for_default_ddp(monkeypatch):
    """The GPU entry of issue 30, with memcheck faked: the default DDP must get `bucket_copy`,
    ddp-view must not, and a category that leaves the ledger fails its row."""
    from dpbook import memcheck

    ledger = {"parameters": 1, "gradients": 1, "optimizer": 2, "buffers": 1}

    def fake_run(spec, strategy, nproc):
        report = memcheck.Report(strategy, nproc, "auto")
        measured = dict(ledger, buffers=0 if strategy == "ddp-view" else 1)
        predicted = dict(ledger, buffers=measured["buffers"])
        report.ranks = [{"rank": 0, "predicted": predicted, "measured": measured}]
        report.diagnoses = [{"code": "bucket_copy", "message": ""}] if strategy == "ddp" else []
        return report

    monkeypatch.setattr(memcheck, "run", fake_run)
    assert [ok for _, ok, _ in gpu_check.memcheck_rows(2)] == [True, True]

    def wrong(spec, strategy, nproc):  # a wrong wrapper: DDP without its diagnosis
        report = fake_run(spec, strategy, nproc)
        report.diagnoses = []
        return report

    monkeypatch.setattr(memcheck, "run", wrong)
    assert [ok for _, ok, _ in gpu_check.memcheck_rows(2)] == [False, True]
