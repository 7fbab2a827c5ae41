"""The ring animation: frames from the simulator's trace, counters, SVG, and the real AllReduce."""

import time
import xml.etree.ElementTree as ET

import pytest

from dpbook import costs, launch, workers
from dpbook.widgets import ring


@pytest.mark.parametrize("n", range(2, ring.MAX_RANKS + 1))
def test_frames_step_through_both_phases(n):
    frames = ring.ring_frames(n, nbytes=8e6)
    assert len(frames) == 2 * (n - 1) + 1
    assert [f.phase for f in frames].count("reduce-scatter") == n - 1
    assert all(len(f.sends) == n for f in frames[1:]) and frames[0].sends == ()
    # after reduce-scatter each rank holds exactly one complete chunk, chunk (r+1) mod N
    mid = frames[n - 1]
    for r in range(n):
        assert [c for c in range(n) if mid.complete(r, c)] == [(r + 1) % n]
    last = frames[-1]
    for r in range(n):
        assert last.values[r] == tuple((c + 1) * n * (n + 1) / 2 for c in range(n))
        assert all(last.complete(r, c) for c in range(n))
        assert last.sent[r] == last.received[r] == pytest.approx(costs.ring_bytes("all_reduce", 8e6, n))
    # counters grow by one chunk per step
    for a, b in zip(frames, frames[1:]):
        assert b.sent[0] - a.sent[0] == pytest.approx(8e6 / n)


def test_first_step_values():
    f = ring.ring_frames(3)[1]
    # rank r sent chunk r to rank r+1, which added it: rank 1 chunk 0 = 1*1 + 2*1
    assert f.values[1][0] == 3 and f.values[2][1] == 2 * 2 + 3 * 2 and f.values[0][2] == 3 + 9
    assert f.counts[1][0] == 2 and f.counts[1][1] == 1


def test_svg_is_valid_and_vietnamese():
    for f in ring.ring_frames(5):
        root = ET.fromstring(ring.render.render(f))
        assert root.tag.endswith("svg")
        text = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
        assert "Rank 4" in text and "Byte đã gửi" in text and "Cách tập trung" in text
    assert "Xong" in ring.caption(ring.ring_frames(5)[-1])


def test_player_html_is_self_contained_and_small():
    html = ring.player(8, presentation=True).standalone_html()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "<script src" not in html
    assert len(html.encode()) < 1_000_000
    assert 'class="dpb-player dpb-present dpb-lecture"' in html  # one screen, no scrolling


def test_rebuild_is_fast():
    t0 = time.perf_counter()
    ring.player(ring.MAX_RANKS, 1e9).to_html()
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize("bad", [1, 9, 2.5])
def test_bad_world_size(bad):
    with pytest.raises(ValueError, match="world_size"):
        ring.ring_frames(bad)


@pytest.mark.distributed
def test_final_values_equal_torch_all_reduce():
    n = 4
    inputs = [t.tolist() for t in ring.ring_inputs(n)]
    real = launch.spawn(workers.all_reduce_values, inputs, world_size=n, backend="gloo",
                        output="none")
    frames = ring.ring_frames(n)
    assert all(list(frames[-1].values[r]) == real[r] for r in range(n))
