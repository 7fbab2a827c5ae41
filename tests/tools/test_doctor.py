"""``python -m dpbook.doctor``: its tables on this machine, and on machines built by hand (a Kaggle
2×T4 notebook, Colab's one GPU, a node of 8 H100, a container with a small ``/dev/shm``)."""

import subprocess
import sys

import pytest
import torch

from dpbook import launch
from dpbook.tools import doctor
from dpbook.tools.machine import Gpu, Machine

GIB = 2**30


def node(gpus=(), p2p=True, notebook=None, shm=8 * GIB, cores=4, nccl="2.27.3"):
    """A machine with the GPUs ``gpus`` (``(name, capability, built_for)``)."""
    found = tuple(Gpu(i, name, cap, 16 * GIB, built) for i, (name, cap, built) in enumerate(gpus))
    n = len(found)
    return Machine(cores, 32 * GIB, shm, "2.13.0", "12.6" if found else None, ("sm_75", "sm_80"),
                   found, nccl if found else None,
                   {(i, j): p2p for i in range(n) for j in range(n) if i != j}, notebook)


T4, H100, P100 = ("Tesla T4", (7, 5), True), ("NVIDIA H100", (9, 0), True), \
    ("Tesla P100", (6, 0), False)


def rows(m):
    return {r.part.split(" (")[0]: r for r in doctor.modes(m)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="máy có GPU: bảng khác")
def test_this_machine_prints_both_tables():
    proc = subprocess.run([sys.executable, "-m", "dpbook.doctor"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Máy này có gì" in out and "Sách chạy thế nào trên máy này" in out
    assert "GPU                       không có" in out and "gloo, 2 process trên CPU" in out
    assert "/dev/shm" in out and "Nhân CPU dùng được" in out


def test_a_kaggle_t4_pair_runs_nccl_in_fp16_through_host_memory():
    m = node([T4, T4], p2p=False, notebook="Kaggle")
    r = rows(m)
    assert r["Các ô nhiều rank của phần 4.1 và 4.2"].mode == "NCCL, 2 process, mỗi process một GPU"
    assert r["Các ô nhiều rank của phần 4.1 và 4.2"].advice == ""
    assert r["Script torchrun"].mode == "NCCL, 2 worker, mỗi worker một GPU"
    assert r["Độ chính xác hỗn hợp"].mode == "fp16 + GradScaler (sm_75 không có bf16 gốc)"
    assert "GradScaler" in r["Độ chính xác hỗn hợp"].advice
    assert r["Các ô 4 rank"].mode == "gloo, 4 process trên CPU"
    assert "Kaggle cho tối đa 2" in r["Các ô 4 rank"].advice
    assert "transport SHM" in r["Đo băng thông, thời gian bước"].mode
    facts = dict(doctor.facts(m))
    assert facts["GPU cuda:1"] == "Tesla T4, sm_75, 16,0 GiB, bf16 gốc: không"
    assert facts["P2P giữa các GPU"] == "không có giữa 0→1, 1→0"
    assert facts["Notebook đám mây"] == "Kaggle" and facts["NCCL"] == "2.27.3"


def test_one_gpu_notebooks_say_how_to_get_two():
    kaggle = rows(node([T4], notebook="Kaggle"))["Các ô nhiều rank của phần 4.1 và 4.2"]
    assert kaggle.mode == "gloo, 2 process trên CPU"
    assert "Settings → Accelerator → “GPU T4 x2”" in kaggle.advice
    colab = rows(node([T4], notebook="Colab"))["Các ô nhiều rank của phần 4.1 và 4.2"]
    assert colab.mode == "gloo, 2 process trên CPU"
    assert "Colab cấp một GPU cho mỗi phiên" in colab.advice and "GPU T4 x2" in colab.advice


def test_a_node_of_eight_h100_needs_nothing_changed():
    m = node([H100] * 8)
    for r in doctor.modes(m):
        assert r.advice == "", r
    r = rows(m)
    assert r["Các ô nhiều rank của phần 4.1 và 4.2"].mode == "NCCL, 8 process, mỗi process một GPU"
    assert r["Các ô 4 rank"].mode == "NCCL, 4 process, mỗi process một GPU"
    assert r["Độ chính xác hỗn hợp"].mode.startswith("bf16")
    assert "P2P trực tiếp" in r["Đo băng thông, thời gian bước"].mode
    assert dict(doctor.facts(m))["P2P giữa các GPU"] == "có, giữa mọi cặp GPU"


def test_a_small_dev_shm_without_p2p_is_told_how_to_grow():
    advice = rows(node([T4, T4], p2p=False, shm=64 * 2**20))["Đo băng thông, thời gian bước"].advice
    assert "/dev/shm chỉ có 0,1 GiB" in advice and "--shm-size=2g" in advice
    # a Kaggle notebook cannot resize it (review D21): NCCL leaves shared memory instead
    kaggle = node([T4, T4], p2p=False, shm=64 * 2**20, notebook="Kaggle")
    advice = rows(kaggle)["Đo băng thông, thời gian bước"].advice
    assert "NCCL_SHM_DISABLE=1" in advice and "--shm-size" not in advice


def test_a_gpu_the_wheel_cannot_run_or_a_build_without_nccl_falls_back_to_the_cpu():
    r = rows(node([P100]))
    assert r["Các ô nhiều rank của phần 4.1 và 4.2"].mode == "gloo, 2 process trên CPU"
    assert "không có mã cho sm_60" in r["Các ô nhiều rank của phần 4.1 và 4.2"].advice
    assert "KHÔNG có mã cho sm_60" in dict(doctor.facts(node([P100])))["GPU cuda:0"]
    no_nccl = rows(node([H100, H100], nccl=None))
    assert "không có NCCL" in no_nccl["Các ô nhiều rank của phần 4.1 và 4.2"].advice


@pytest.mark.parametrize("gpus", range(0, 9))
def test_the_modes_are_the_launchers_own_rule(gpus):
    r = rows(node([H100] * gpus))
    for part, ranks in (("Các ô nhiều rank của phần 4.1 và 4.2", None), ("Các ô 4 rank", 4)):
        p = launch.plan(ranks, gpus=gpus)
        assert r[part].mode.startswith(p.backend.upper() if p.backend == "nccl" else "gloo")
        assert f" {p.world_size} process" in r[part].mode


def test_cells_wrap_inside_their_columns():
    text = doctor.table([("một ô rất dài " * 6, "ngắn"), ("a", "")], (20, 10))
    lines = text.splitlines()
    assert len(lines) == 6 and all(len(line) <= 32 for line in lines)
    assert lines[-1].rstrip().endswith("—")  # an empty cell shows a dash
    assert "Sách chạy thế nào trên máy này" in doctor.report(node())


def with_driver(m, names, driver, cuda):
    from dataclasses import replace
    return replace(m, system_gpus=names, driver=driver, cuda_version=cuda)


def test_gpus_torch_cannot_use_are_named_with_the_driver_and_the_build_to_install():
    """D14: the driver lists GPUs, torch sees none. Which build to install depends on the
    driver: CUDA 13 needs >= 580, CUDA 12 >= 525 (NVIDIA's release notes, doctor.MIN_DRIVER)."""
    bare = node()
    old = with_driver(bare, ("Tesla T4", "Tesla T4"), "550.54.15", "13.0")
    advice = doctor.unusable_gpus_advice(old)
    assert "CUDA 13.0, cần driver ≥ 580" in advice and "make setup TORCH=cu126" in advice
    report = doctor.report(old)
    assert "KHÔNG DÙNG ĐƯỢC" in report and "driver 550.54.15" in report
    cpu = with_driver(bare, ("NVIDIA H100",), "580.95.05", None)
    assert "chỉ chạy trên CPU" in doctor.unusable_gpus_advice(cpu)
    ancient = with_driver(bare, ("Tesla K80",), "470.82.01", "13.0")
    assert "nâng driver" in doctor.unusable_gpus_advice(ancient)
    assert doctor.unusable_gpus_advice(bare) is None  # no driver, no GPU: nothing to fix
