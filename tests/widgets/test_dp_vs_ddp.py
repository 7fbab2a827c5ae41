"""DP against DDP in one iteration: the step model's traffic against closed forms, GPU 0's
extra load on the DP side, the GIL and overlap steps, and the SVG."""

import time
import unicodedata
import xml.etree.ElementTree as ET

import pytest

from dpbook import costs
from dpbook.widgets import dp_vs_ddp
from dpbook.widgets.dp_vs_ddp import render

M, X, OUT = dp_vs_ddp.RESNET50_BYTES, dp_vs_ddp.BATCH_BYTES, dp_vs_ddp.OUTPUT_BYTES


def _phase(steps, name):
    return next(s for s in steps if s.phase == name)


def _delta(steps, name, side):
    """What one step adds to the cumulative counters of ``side``: (sent, received) per GPU."""
    i = next(k for k, s in enumerate(steps) if s.phase == name)
    after, before = getattr(steps[i], side), getattr(steps[i - 1], side) if i else None
    zero = (0.0,) * len(after.sent)
    sent_before, recv_before = (before.sent, before.received) if before else (zero, zero)
    return ([a - b for a, b in zip(after.sent, sent_before)],
            [a - b for a, b in zip(after.received, recv_before)])


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("buckets", [1, 3])
def test_final_traffic_matches_the_closed_forms(n, buckets):
    steps = dp_vs_ddp.iteration_steps(n, buckets=buckets)
    assert len(steps) == n + buckets + 6
    dp, ddp = steps[-1].dp.traffic, steps[-1].ddp.traffic
    gpu0 = X * (2 * n - 1) / n + 2 * (n - 1) * M + 2 * (n - 1) / n * OUT
    other = X / n + 2 * M + 2 * OUT / n
    each = X / n + 4 * (n - 1) / n * M
    assert dp[0] == pytest.approx(gpu0) and dp[1:] == pytest.approx([other] * (n - 1))
    assert ddp == pytest.approx([each] * n)
    assert dp_vs_ddp.traffic_totals(n) == pytest.approx({"dp_gpu0": gpu0, "dp_other": other, "ddp": each})


def test_worked_example_resnet50_on_4_gpus():
    t = dp_vs_ddp.traffic_totals(4)
    assert (t["dp_gpu0"], t["dp_other"], t["ddp"]) == (681_189_312, 214_218_048, 316_318_176)
    final = dp_vs_ddp.iteration_steps(4)[-1]
    assert final.dp.traffic[0] == t["dp_gpu0"] and set(final.ddp.traffic) == {t["ddp"]}


@pytest.mark.parametrize("n", [2, 4, 8])
def test_model_traffic_uses_the_costs_formulas(n):
    steps = dp_vs_ddp.iteration_steps(n)
    sent, _ = _delta(steps, "Sao chép mô hình", "dp")
    assert sent[0] == (n - 1) * M == costs.naive_all_reduce_bytes(M, n)  # replicate, every time
    _, received = _delta(steps, "Cộng gradient", "dp")
    assert received[0] == costs.naive_all_reduce_bytes(M, n) and received[1:] == [0] * (n - 1)
    # DDP: the buckets add up to one ring AllReduce of all gradients, sent by every GPU
    ddp = steps[-1].ddp
    assert ddp.sent == pytest.approx([costs.ring_bytes("all_reduce", M, n)] * n)
    assert ddp.sent[0] == pytest.approx(2 * (n - 1) / n * M)
    # each GPU receives as much as it sends, plus its own X/N from the host
    assert [r - X / n for r in ddp.received] == pytest.approx(list(ddp.sent))


@pytest.mark.parametrize("n", range(2, 9))
def test_gpu0_carries_more_on_dp_and_all_gpus_are_equal_on_ddp(n):
    steps = dp_vs_ddp.iteration_steps(n, buckets=4)
    for s in steps:
        assert s.dp.traffic[0] >= max(s.dp.traffic[1:])
        assert len(set(s.ddp.traffic)) == 1
    final = steps[-1]
    assert final.dp.traffic[0] > max(final.dp.traffic[1:])
    assert final.dp.traffic[0] > final.ddp.traffic[0]
    # GPU 0's DP traffic grows with N; DDP's stays below X/N + 4 M
    assert final.ddp.traffic[0] < X / n + 4 * M


def test_counters_only_grow_and_host_copies_count_once():
    steps = dp_vs_ddp.iteration_steps(5)
    for a, b in zip(steps, steps[1:]):
        for side in ("dp", "ddp"):
            pa, pb = getattr(a, side), getattr(b, side)
            assert all(y >= x for x, y in zip(pa.sent + pa.received, pb.sent + pb.received))
    first = steps[0]
    assert first.dp.received[0] == X and first.dp.sent[0] == pytest.approx(4 * X / 5)
    assert first.ddp.received == pytest.approx([X / 5] * 5) and first.ddp.sent == (0.0,) * 5


def test_gil_is_one_lock_taken_in_turn_during_dp_forward():
    n = 4
    forward = [s for s in dp_vs_ddp.iteration_steps(n) if s.phase.startswith("Lan truyền xuôi")]
    assert [s.dp.gil for s in forward] == list(range(n))
    for k, s in enumerate(forward):
        assert s.dp.threads.count("giữ GIL") == 1 and s.dp.threads[k] == "giữ GIL"
        assert [st == "compute" for st in s.dp.state] == [j <= k for j in range(n)]
        assert s.ddp.gil is None and s.ddp.state == ("compute",) * n
        assert s.ddp.threads == ("GIL riêng",) * n


def test_ddp_overlaps_allreduce_with_backward_and_dp_does_not():
    steps = dp_vs_ddp.iteration_steps(4, buckets=3)
    backward = [s for s in steps if s.phase.startswith("Lan truyền ngược")]
    assert len(backward) == 3
    assert not backward[0].ddp.transfers  # the first bucket is still being computed
    for s in backward[1:]:
        assert s.ddp.state == ("compute",) * 4 and len(s.ddp.transfers) == 4
        assert {(t.src, t.dst) for t in s.ddp.transfers} == {(0, 1), (1, 2), (2, 3), (3, 0)}
        assert not s.dp.transfers
    last = _phase(steps, "Cộng gradient")
    assert last.ddp.state == ("comm",) * 4 and "bucket 3" in last.ddp.summary
    assert {t.dst for t in last.dp.transfers} == {0}


def test_only_gpu0_computes_loss_and_optimizer_step_on_dp():
    steps = dp_vs_ddp.iteration_steps(3)
    for name in ("Tính loss", "Cập nhật tham số"):
        s = _phase(steps, name)
        assert s.dp.state == ("compute", "idle", "idle") and s.ddp.state == ("compute",) * 3
    gather = _phase(steps, "Gom đầu ra")
    assert {t.dst for t in gather.dp.transfers} == {0} and not gather.ddp.transfers
    replicate = _phase(steps, "Sao chép mô hình")
    assert {t.src for t in replicate.dp.transfers} == {0} and replicate.ddp.state == ("idle",) * 3


@pytest.mark.parametrize("kwargs, word", [
    ({"world_size": 1}, "world_size"), ({"world_size": 9}, "world_size"),
    ({"world_size": True}, "world_size"), ({"buckets": 0}, "buckets"),
    ({"buckets": 7}, "buckets"), ({"model_bytes": 0}, "model_bytes"),
    ({"input_bytes": -1.0}, "input_bytes"),
])
def test_bad_inputs_say_what_is_allowed(kwargs, word):
    with pytest.raises(ValueError, match=word):
        dp_vs_ddp.iteration_steps(**kwargs)


def test_svg_is_valid_and_vietnamese():
    steps = dp_vs_ddp.iteration_steps(4)
    top = steps[-1].dp.traffic[0]
    ns = "{http://www.w3.org/2000/svg}"
    for i, s in enumerate(steps):
        svg = render.render(s, i, len(steps), top)
        assert unicodedata.is_normalized("NFC", svg + s.caption)
        texts = [t.text for t in ET.fromstring(svg).iter(f"{ns}text")]
        for label in ("Lưu lượng vào + ra", "tính toán", "truyền dữ liệu", "luồng 0",
                      "process 0", "CPU", f"Bước {i + 1}/{len(steps)} · {s.phase}"):
            assert label in texts, (i, label)
    forward = render.render(steps[3], 3, len(steps), top)
    assert "→ luồng 1" in forward and "giữ GIL" in forward
    ring = render.render(steps[-2], len(steps) - 2, len(steps), top)
    assert "AllReduce bucket 3: mỗi GPU gửi 51,1 MB cho GPU kế tiếp (vòng)" in ring


def test_player_builds_fast_for_the_largest_setting():
    t0 = time.perf_counter()
    player = dp_vs_ddp.player(dp_vs_ddp.MAX_GPUS, buckets=6)
    html = player.to_html()
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, elapsed
    assert len(player.frames) == dp_vs_ddp.MAX_GPUS + 6 + 6 and "Qua GPU 0 đến giờ" in html


def test_live_controls_build():
    status = dp_vs_ddp.controls().children[1].value
    assert status.startswith("Dựng lại"), status


def test_summaries_fit_one_line_beside_the_traffic_panel():
    for n in (2, 8):
        for s in dp_vs_ddp.iteration_steps(n, buckets=6):
            assert len(s.dp.summary) <= 64 and len(s.ddp.summary) <= 64, s.phase
