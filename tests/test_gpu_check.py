"""``make gpu-check`` on a machine without GPU exits cleanly and says why."""

import subprocess
import sys

import pytest
import torch

from dpbook import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="máy có GPU: lệnh sẽ chạy thật")
def test_without_gpu_it_says_so_and_exits_zero():
    proc = subprocess.run([sys.executable, "-m", "dpbook.gpu_check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0
    assert "Không tìm thấy GPU" in proc.stdout


def test_world_sizes_cover_powers_of_two_and_the_gpu_count():
    assert gpu_check.world_sizes(1) == [1]
    assert gpu_check.world_sizes(3) == [1, 2, 3]
    assert gpu_check.world_sizes(8) == [1, 2, 4, 8]
    assert gpu_check.world_sizes(6) == [1, 2, 4, 6]
