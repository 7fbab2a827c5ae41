"""Lab D (section 4.2, DDP from scratch): ``dpbook.labs.lab_d`` and its checker.

The judging is pure (``judge_*`` on measurements); one real launch checks that the reference
passes and that a broken version fails exactly its two items.
"""

import math

import pytest
import torch

from dpbook import buckets
from dpbook.labs.lab_d import BROKEN, NAMES, SOLUTION, STARTER, checker, common, load


def ring_rows(world, sent=None, diff=0.0, others=(), shapes=((8,), (7,))):
    """What ``measure_ring`` returns on each rank for a correct ring (or one that is not)."""
    reports = []
    for r in range(world):
        rows = []
        for shape in shapes:
            n = math.prod(shape)
            chunks = torch.arange(n).tensor_split(world)
            # rank r sends every chunk but one in each phase: (N-1) chunks twice
            ok = 4 * (sum(c.numel() for c in chunks) - chunks[(r + 2) % world].numel()
                      + sum(c.numel() for c in chunks) - chunks[(r + 1) % world].numel())
            rows.append({"shape": shape, "numel": n, "nbytes": 4 * n, "diff": diff,
                         "sent": ok if sent is None else sent(n), "others": list(others)})
        reports.append({"ring": rows})
    return reports


def test_ring_judge_accepts_a_ring_and_names_the_size_it_gets_wrong():
    assert checker.judge_ring(ring_rows(2), 2).passed
    assert checker.judge_ring_bytes(ring_rows(2), 2).passed
    assert checker.judge_ring_bytes(ring_rows(3, shapes=((9,), (10,), (2,))), 3).passed
    item = checker.judge_ring(ring_rows(2, diff=0.5), 2)
    assert not item.passed and "kích thước 8" in item.detail
    item = checker.judge_ring(ring_rows(2, others=["all_reduce"]), 2)
    assert not item.passed and "all_reduce" in item.detail
    item = checker.judge_ring_bytes(ring_rows(2, sent=lambda n: 4 * n * 2), 2)  # whole tensor
    assert not item.passed and "MỘT đoạn" in item.hint
    item = checker.judge_ring_bytes(ring_rows(2, sent=lambda n: 4 * (n // 2) * 2), 2)
    assert not item.passed and "kích thước 7" in item.detail and "phần dư" in item.hint
    broken = ring_rows(2)
    broken[0]["ring"][1] = {"shape": (7,), "numel": 7, "nbytes": 28, "error": "ValueError: x"}
    assert "ValueError" in checker.judge_ring(broken, 2).detail
    assert not checker.judge_ring_bytes(broken, 2).passed


def ddp_report(sizes, seen, grad_diff=0.0, weight_diff=0.0):
    return {"ddp": {"my_sizes": sizes, "seen": seen, "grad_diff": grad_diff,
                    "weight_diff": weight_diff}}


def test_bucket_and_overlap_judges():
    expected = checker.expected_buckets()
    sizes = [b.nbytes for b in expected]
    cap, largest = int(common.CAP_MB * 1024 * 1024), 4 * 128 * 64
    good = [ddp_report([sizes] * 2, [[0, 0, 0, 0, 1, 1, 2, 2]] * 2)]
    assert checker.judge_buckets(good, expected, cap, largest).passed
    item = checker.judge_overlap(good)
    assert item.passed and "4/8" in item.detail
    at_end = [ddp_report([[sum(sizes)]] * 2, [[0] * 8] * 2)]
    item = checker.judge_buckets(at_end, expected, cap, largest)
    assert not item.passed and "1 AllReduce" in item.detail
    assert not checker.judge_overlap(at_end).passed
    one_per_tensor = [ddp_report([[4] * 8] * 2, [[0, 1, 2, 3, 4, 5, 6, 7]] * 2)]
    assert not checker.judge_buckets(one_per_tensor, expected, cap, largest).passed
    assert checker.judge_grads(good).passed
    item = checker.judge_grads([ddp_report([], [], grad_diff=0.3)])
    assert not item.passed and "TRUNG BÌNH" in item.hint
    assert not checker.judge_weights([ddp_report([], [], weight_diff=1e-3)]).passed
    crashed = [{"ddp": {"error": "RuntimeError: x"}}]
    assert [checker.judge_overlap(crashed).passed, checker.judge_weights(crashed).passed] == \
        [False, False]


def test_expected_buckets_are_dpbook_buckets_rule():
    expected = checker.expected_buckets()
    names = [p.name for p in buckets.model_params(common.build_model())]
    assert [[names[i] for i in b.params] for b in expected] == [
        ["fc4.bias", "fc4.weight", "fc3.bias", "fc3.weight"], ["fc2.bias", "fc2.weight"],
        ["fc1.bias", "fc1.weight"]]
    cap = int(common.CAP_MB * 1024 * 1024)
    assert all(b.nbytes >= cap for b in expected[:-1]) and expected[-1].nbytes < cap


def test_broadcast_judge():
    a, b = torch.ones(3), torch.zeros(2)
    good = [{"broadcast": {"before": (a, b), "after": (a, b)}},
            {"broadcast": {"before": (a + 1, b + 1), "after": (a, b)}}]
    assert checker.judge_broadcast(good).passed
    no_buffers = [good[0], {"broadcast": {"before": (a + 1, b + 1), "after": (a, b + 1)}}]
    item = checker.judge_broadcast(no_buffers)
    assert not item.passed and "buffer" in item.hint
    averaged = [{"broadcast": {"before": (a, b), "after": (a + .5, b)}},
                {"broadcast": {"before": (a + 1, b), "after": (a + .5, b)}}]
    assert not checker.judge_broadcast(averaged).passed  # equal, but not rank 0's


def test_load_and_bad_arguments(tmp_path):
    assert all(hasattr(load(p), n) for p in (SOLUTION, STARTER, *BROKEN.values()) for n in NAMES)
    assert load(SOLUTION) is not load(SOLUTION)  # a fresh module each time
    assert checker.judge_load([{"load": "thiếu MyDDP"}]).hint
    with pytest.raises(ValueError, match="Không thấy file"):
        checker.check(tmp_path / "nope.py")
    with pytest.raises(ValueError, match="world_size"):
        checker.check(SOLUTION, world_size=1)
    assert checker.main(["/khong/co/file.py"]) == 2


def test_command_line_refuses_a_missing_or_broken_file(refuses_without_starting):
    refuses_without_starting("lab_d")


def test_failed_launch_says_why():
    r = checker.failed_launch("x.py", 2, TimeoutError("hết giờ"))
    assert not r.passed and r.failed == ["launch"] and "send/recv" in r.items[0].hint
    assert "CHƯA ĐẠT" in str(r)


@pytest.mark.distributed
def test_reference_passes_and_the_late_ddp_fails_two_items():
    good, late = checker.check_files([SOLUTION, BROKEN["all_at_end"]], verbose=False)
    assert good.passed and len(good.items) == 8, str(good)
    assert late.failed == ["buckets", "overlap"], str(late)
