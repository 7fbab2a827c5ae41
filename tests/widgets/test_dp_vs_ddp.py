"""DP against DDP in one training step: the frame model's traffic against closed forms (NCCL chains
for DP's Broadcast and Reduce, the star fallback), GPU 0's copies, the GIL and overlap, and the SVG."""

import re
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


def _dp_closed_form(n):
    """DP with NCCL, per GPU: GPU 0 copies X and O; Broadcast and Reduce are chains."""
    gpu0 = X * (2 * n - 1) / n + 2 * M + 2 * (n - 1) / n * OUT
    ends = X / n + (2 * M if n == 2 else 3 * M) + 2 * OUT / n  # GPU 1 and GPU N-1
    middle = X / n + 4 * M + 2 * OUT / n
    return [gpu0, ends] + [middle] * (n - 3) + ([ends] if n > 2 else [])


@pytest.mark.parametrize("n", range(2, 9))
@pytest.mark.parametrize("buckets", [1, 3])
def test_final_traffic_matches_the_closed_forms(n, buckets):
    steps = dp_vs_ddp.iteration_steps(n, buckets=buckets)
    assert len(steps) == n + buckets + 6
    dp, ddp = steps[-1].dp.traffic, steps[-1].ddp.traffic
    each = X / n + 4 * (n - 1) / n * M
    assert dp == pytest.approx(_dp_closed_form(n))
    assert ddp == pytest.approx([each] * n)
    totals = dp_vs_ddp.traffic_totals(n)
    assert totals["dp"] == pytest.approx(dp) and totals["ddp"] == pytest.approx(ddp)


@pytest.mark.parametrize("n", range(2, 9))
def test_star_fallback_without_nccl_is_the_naive_scheme(n):
    star = dp_vs_ddp.traffic_totals(n, route="star")["dp"]
    gpu0 = X * (2 * n - 1) / n + 2 * (n - 1) * M + 2 * (n - 1) / n * OUT
    assert star[0] == pytest.approx(gpu0)
    assert star[0] == pytest.approx(X * (2 * n - 1) / n + 2 * costs.naive_all_reduce_bytes(M, n)
                                    + 2 * (n - 1) / n * OUT)
    assert star[1:] == pytest.approx([X / n + 2 * M + 2 * OUT / n] * (n - 1))
    # the chain and the star agree for two GPUs (one link), and differ from three on
    assert (star == pytest.approx(dp_vs_ddp.traffic_totals(n)["dp"])) == (n == 2)


def test_worked_example_resnet50_on_4_gpus():
    t = dp_vs_ddp.traffic_totals(4)
    assert t["dp"] == (272_276_800, 316_446_176, 418_674_304, 316_446_176)
    assert t["ddp"] == (316_318_176,) * 4
    final = dp_vs_ddp.iteration_steps(4)[-1]
    assert final.dp.traffic == t["dp"] and final.ddp.traffic == t["ddp"]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_model_traffic_uses_the_costs_formulas(n):
    steps = dp_vs_ddp.iteration_steps(n)
    for name, collective in (("Sao chép mô hình", "broadcast"), ("Cộng gradient", "reduce")):
        sent, received = _delta(steps, name, "dp")
        chain = costs.rooted_bytes(collective, M, n)
        assert sent == pytest.approx(chain.sent) and received == pytest.approx(chain.received)
        s = _phase(steps, name)
        assert {(t.src, t.dst) for t in s.dp.transfers} == set(costs.rooted_links(collective, n))
        assert {t.kind for t in s.dp.transfers} == {"nccl"}
        assert max(sent) == pytest.approx(M) and M == costs.ring_bytes(collective, M, n)  # M at most
    sent, _ = _delta(steps, "Sao chép mô hình", "dp")
    _, received = _delta(steps, "Cộng gradient", "dp")
    assert sent[0] == pytest.approx(M) and received[0] == pytest.approx(M)  # not (N-1) M
    # DDP: the buckets add up to one ring AllReduce of all gradients, sent by every GPU
    ddp = steps[-1].ddp
    assert ddp.sent == pytest.approx([costs.ring_bytes("all_reduce", M, n)] * n)
    assert ddp.sent[0] == pytest.approx(2 * (n - 1) / n * M)
    # each GPU receives as much as it sends, plus its own X/N from the host
    assert [r - X / n for r in ddp.received] == pytest.approx(list(ddp.sent))


@pytest.mark.parametrize("n", range(2, 9))
def test_gpu0_copies_the_batch_and_outputs_on_dp_and_all_gpus_are_equal_on_ddp(n):
    steps = dp_vs_ddp.iteration_steps(n, buckets=4)
    for s in steps:
        assert len(set(s.ddp.traffic)) == 1
    # scatter, gather and the outputs' gradients are plain copies, all through GPU 0
    for name in ("Chia dữ liệu", "Gom đầu ra"):
        ts = _phase(steps, name).dp.transfers
        assert {t.kind for t in ts} == {"copy"} and all(0 in (t.src, t.dst) for t in ts)
    first_backward = next(s for s in steps if s.phase.startswith("Lan truyền ngược"))
    assert all(t.src == 0 and t.kind == "copy" for t in first_backward.dp.transfers)
    copies = [t for s in steps for t in s.dp.transfers if t.kind == "copy"]
    through0 = sum(t.nbytes for t in copies if 0 in (t.src, t.dst))
    assert through0 == pytest.approx(X + (n - 1) / n * X + 2 * (n - 1) / n * OUT)
    # DDP's bytes stay below X/N + 4 M; DP's busiest GPU is within 4 M + 2 X of it
    final = steps[-1]
    assert final.ddp.traffic[0] < X / n + 4 * M
    assert max(final.dp.traffic) < final.ddp.traffic[0] + 4 * M / n + 2 * X


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
    # DP's Reduce comes after the whole backward, a chain that ends at GPU 0
    assert {(t.src, t.dst) for t in last.dp.transfers} == {(1, 2), (2, 3), (3, 0)}


def test_only_gpu0_computes_loss_and_optimizer_step_on_dp():
    steps = dp_vs_ddp.iteration_steps(3)
    for name in ("Tính hàm mất mát", "Cập nhật tham số"):
        s = _phase(steps, name)
        assert s.dp.state == ("compute", "idle", "idle") and s.ddp.state == ("compute",) * 3
    gather = _phase(steps, "Gom đầu ra")
    assert {t.dst for t in gather.dp.transfers} == {0} and not gather.ddp.transfers
    replicate = _phase(steps, "Sao chép mô hình")
    assert {(t.src, t.dst) for t in replicate.dp.transfers} == {(0, 1), (1, 2)}
    assert replicate.ddp.state == ("idle",) * 3


@pytest.mark.parametrize("kwargs, word", [
    ({"world_size": 1}, "world_size"), ({"world_size": 9}, "world_size"),
    ({"world_size": True}, "world_size"), ({"buckets": 0}, "buckets"),
    ({"buckets": 7}, "buckets"), ({"model_bytes": 0}, "model_bytes"),
    ({"input_bytes": -1.0}, "input_bytes"),
])
def test_bad_inputs_say_what_is_allowed(kwargs, word):
    with pytest.raises(ValueError, match=word):
        dp_vs_ddp.iteration_steps(**kwargs)


def test_traffic_totals_rejects_an_unknown_route():
    with pytest.raises(ValueError, match="route"):
        dp_vs_ddp.traffic_totals(4, route="ring")


def test_svg_is_valid_and_vietnamese():
    steps = dp_vs_ddp.iteration_steps(4)
    top = steps[-1].dp.traffic[0]
    ns = "{http://www.w3.org/2000/svg}"
    for i, s in enumerate(steps):
        svg = render.render(s, i, len(steps), top)
        assert unicodedata.is_normalized("NFC", svg + s.caption)
        texts = [t.text for t in ET.fromstring(svg).iter(f"{ns}text")]
        for label in ("Lưu lượng vào + ra", "tính toán", "truyền dữ liệu", "luồng 0",
                      "process 0", "CPU", s.phase):
            assert label in texts, (i, label)
        # one step counter, the player's: the drawing does not number its frames
        assert not any(re.search(r"Bước \d+/\d+", t or "") for t in texts), (i, texts)
    forward = render.render(steps[3], 3, len(steps), top)
    assert "→ luồng 1" in forward and "giữ GIL" in forward
    ring = render.render(steps[-2], len(steps) - 2, len(steps), top)
    assert "AllReduce bucket 3: mỗi GPU gửi 51,1 MB cho GPU kế tiếp (vòng)" in ring
    chain = render.render(steps[1], 1, len(steps), top)
    assert "bản sao mô hình: chuỗi NCCL, 102 MB mỗi chặng" in chain
    reduce = render.render(steps[-2], len(steps) - 2, len(steps), top)
    assert "gradient: chuỗi NCCL, 102 MB mỗi chặng" in reduce


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
