"""The probes of ``python -m dpbook.doctor`` and ``make gpu-check``: on this machine, and on a
Kaggle 2×T4 notebook faked with monkeypatch (a CUDA build of torch seeing two T4s)."""

import os
import types

import pytest
import torch
import torch.distributed as dist

from dpbook.tools import machine

T4 = types.SimpleNamespace(name="Tesla T4", major=7, minor=5, total_memory=15_828_320_256)


def test_this_machine():
    m = machine.probe(environ={})
    assert 1 <= m.cpu_cores <= os.cpu_count()
    assert m.memory_bytes is None or m.memory_bytes > 2**28
    assert m.torch_version == torch.__version__ and m.notebook is None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert m.gpu_count == gpus and len(m.p2p) == gpus * (gpus - 1)
    if dist.is_nccl_available():
        assert m.nccl.split(".")[0].isdigit()  # "2.27.3"
    else:
        assert m.nccl is None  # a CPU build, like this machine's


@pytest.fixture
def kaggle_t4x2(monkeypatch):
    """This process sees what a Kaggle 'GPU T4 x2' notebook shows torch."""
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: T4)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_75", "sm_80", "sm_90"])
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda i, j: False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    return {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}


def test_a_kaggle_t4_pair_is_seen_as_it_is(kaggle_t4x2):
    m = machine.probe(environ=kaggle_t4x2)
    assert m.notebook == "Kaggle" and m.cuda_version == "12.6" and m.nccl == "2.27.3"
    assert [(g.index, g.sm, g.memory_bytes, g.native_bf16, g.built_for) for g in m.gpus] == [
        (0, "sm_75", 15_828_320_256, False, True), (1, "sm_75", 15_828_320_256, False, True)]
    assert m.pairs_without_p2p() == [(0, 1), (1, 0)]


def test_colab_is_recognised_by_its_variable():
    assert machine.notebook({"COLAB_RELEASE_TAG": "release-colab_20250101"}) == "Colab"
    assert machine.notebook({"HOME": "/root"}) is None


@pytest.mark.parametrize("capability, arch, ok", [
    ((7, 5), ("sm_80", "sm_90"), False),  # a T4 with a wheel built from Ampere on
    ((7, 5), ("sm_75", "sm_80"), True),
    ((8, 9), ("sm_80", "compute_80"), True),  # PTX for an older architecture compiles for it
    ((6, 0), ("sm_70", "compute_70"), False),  # the P100 of Kaggle's one-GPU option
])
def test_a_gpu_the_wheel_has_no_code_for_is_told(capability, arch, ok):
    assert machine.built_for(capability, arch) == ok


def test_a_machine_without_gpus_is_probed_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: pytest.fail("hỏi GPU trên máy không có GPU"))
    assert machine.gpus(("sm_80",)) == () and machine.p2p(0) == {}
