"""DDP buckets: the assignment against PyTorch (its function and a real DDP run), the timeline
invariants, closed-form times, frames, SVG and rebuild time."""

import itertools
import random
import time
import unicodedata
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.distributed as dist
from dpbook import buckets, costs, launch, overlap
from dpbook.launch import spawn
from dpbook.models import build_bucket_net
from dpbook.tracing import ddp_run
from dpbook.widgets import ddp_buckets
from dpbook.widgets.ddp_buckets import render
from torch.nn.parallel import distributed as ddp_mod

MIB = 1024 * 1024


def _torch_assignment(params, limits, order):
    """What DDP's reducer computes when it rebuilds its buckets (tensors in gradient-ready
    order, their original indices as ``tensor_indices``)."""
    dtypes = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16}
    tensors = [torch.empty(params[i].numel, dtype=dtypes[params[i].dtype]) for i in order]
    sparse = [p.sparse for p in params]
    idx, lim = dist._compute_bucket_assignment_by_size(tensors, limits, sparse, list(order))
    return [list(b) for b in idx], list(lim)


def _ours(params, limits, order):
    bks = buckets.assign_buckets(params, limits, order)
    return [list(b.params) for b in bks], [b.limit for b in bks]


# ------------------------------------------------------------------------------ caps


@pytest.mark.parametrize("cap, first", [(None, None), (0.1, None), (0.5, None), (25, None),
                                        (0.1, 0.02), (None, 0.3), (2.5, 4.0)])
def test_cap_limits_follow_ddp_bucket_config(cap, first):
    cfg = ddp_mod._BucketCapacityConfig.create(
        bucket_cap_mb=cap, bucket_cap_mb_list=None if first is None else
        [first, ddp_mod._DEFAULT_BUCKET_CAP_MB if cap is None else cap],
        use_python_reducer=False)
    limits = buckets.cap_limits(cap, first)
    if cfg.per_bucket_bytes_caps:  # bucket_cap_mb_list: the reducer packs with this list
        assert limits == list(cfg.per_bucket_bytes_caps)
    else:  # otherwise the reducer rebuilds with [first_bucket_bytes_cap, bucket_bytes_cap]
        assert limits == [cfg.first_bucket_bytes_cap, cfg.bucket_bytes_cap]


def test_cap_defaults_are_torchs():
    assert buckets.DEFAULT_BUCKET_CAP_MB == ddp_mod._DEFAULT_BUCKET_CAP_MB == 25
    assert buckets.DEFAULT_FIRST_BUCKET_MB * MIB == dist._DEFAULT_FIRST_BUCKET_BYTES == MIB
    assert buckets.cap_limits() == [MIB, 25 * MIB]
    assert buckets.cap_limits(0.1) == [104857, 104857]  # int(0.1 MiB): DDP truncates


@pytest.mark.parametrize("bad", [0, -1, "0.1", True])
def test_cap_limits_refuse_bad_caps(bad):
    with pytest.raises(ValueError, match="bucket_cap_mb phải là số MB dương"):
        buckets.cap_limits(bad)
    with pytest.raises(ValueError, match="first_bucket_cap_mb phải là số MB dương"):
        buckets.cap_limits(0.1, bad)


# ------------------------------------------------------------------------------ assignment


def _p(*numels, dtype="float32"):
    return [buckets.Param(f"p{i}", f"l{i}", n, dtype) for i, n in enumerate(numels)]


def test_assignment_closed_form():
    # 40, 40, 40, 20 bytes; order 3,2,1,0. First limit 50: 20+40 = 60 >= 50 closes
    # [3, 2]; then limit 100: 40+40 = 80 < 100 stays open until the end.
    bks = buckets.assign_buckets(_p(10, 10, 10, 5), [50, 100], [3, 2, 1, 0])
    assert [b.params for b in bks] == [(3, 2), (1, 0)]
    assert [b.nbytes for b in bks] == [60, 80] and [b.limit for b in bks] == [50, 100]
    # the tensor that crosses the cap stays in the bucket it crossed, however large
    assert [b.params for b in buckets.assign_buckets(_p(1000, 1, 1), [12], [2, 1, 0])] == [(2, 1, 0)]
    # reaching the cap exactly closes the bucket
    assert [b.params for b in buckets.assign_buckets(_p(2, 1, 1), [8], [2, 1, 0])] == [(2, 1), (0,)]
    with pytest.raises(TypeError):  # no default order: initial_buckets / rebuilt_buckets say which
        buckets.assign_buckets(_p(1, 2), [8])


def test_assignment_refuses_bad_input():
    with pytest.raises(ValueError, match="limits phải là danh sách số byte nguyên dương"):
        buckets.assign_buckets(_p(1, 2), [0], [0, 1])
    with pytest.raises(ValueError, match="order phải là một hoán vị"):
        buckets.assign_buckets(_p(1, 2), [8], [0, 0])


@pytest.mark.parametrize("cap", [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, None])
@pytest.mark.parametrize("first", [None, 0.01, 0.05])
def test_demo_model_assignment_equals_torch(cap, first):
    params, order = ddp_buckets.demo_params()
    limits = buckets.cap_limits(cap, first)
    for o in (list(order), list(range(len(params)))[::-1]):
        assert _ours(params, limits, o) == _torch_assignment(params, limits, o)


@pytest.mark.parametrize("seed", range(20))
def test_random_sizes_and_orders_equal_torch(seed):
    rng = random.Random(seed)
    params = _p(*(rng.choice([1, 7, 64, 300, 4096, 20000]) for _ in range(rng.randint(1, 30))))
    order = list(range(len(params)))
    rng.shuffle(order)
    limits = [rng.choice([4, 100, 1000, 50000])]
    limits += [rng.choice([64, 2000, 80000])] * rng.randint(0, 2)
    assert _ours(params, limits, order) == _torch_assignment(params, limits, order)


def test_dtypes_are_bucketed_apart_and_sparse_alone():
    params = [buckets.Param("a", "a", 10), buckets.Param("b", "b", 10, "float64"),
              buckets.Param("c", "c", 3), buckets.Param("d", "d", 5, "float64"),
              buckets.Param("e", "e", 4, sparse=True), buckets.Param("f", "f", 9, "float16")]
    for limits in ([40, 8], [1], [10**6], [50, 100]):
        for order in ([5, 4, 3, 2, 1, 0], [0, 2, 1, 4, 3, 5]):
            ours, lim = _ours(params, limits, order)
            theirs, their_lim = _torch_assignment(params, limits, order)
            # PyTorch lists the buckets still open at the end from a hash map: compare as sets
            assert sorted(zip(map(tuple, ours), lim)) == sorted(zip(map(tuple, theirs), their_lim))
            n_closed = sum(1 for b in buckets.assign_buckets(params, limits, order)
                           if b.nbytes >= b.limit or params[b.params[0]].sparse)
            assert ours[:n_closed] == theirs[:n_closed]
            for b in ours:  # one dtype per bucket
                assert len({params[i].dtype for i in b}) == 1


def test_ready_order_is_not_exactly_reverse_registration():
    params, order = ddp_buckets.demo_params()
    names = [params[i].name for i in order]
    assert names[:2] == ["head.bias", "head.weight"] and names[-1] == "inp.weight"
    # LayerNorm gives its weight gradient before its bias: DDP follows that order
    assert names.index("b2.norm.weight") < names.index("b2.norm.bias")
    assert list(order) != list(range(len(params)))[::-1]


def test_model_params_follow_ddp_order():
    model = build_bucket_net()
    assert [p.name for p in buckets.model_params(model)] == [n for n, _ in model.named_parameters()]
    model.b0.norm.weight.requires_grad_(False)  # DDP leaves frozen parameters out
    assert "b0.norm.weight" not in [p.name for p in buckets.model_params(model)]


# ------------------------------------------------------------------------------ timeline


def test_timeline_closed_form():
    # two layers of 1000 and 3000 float32 parameters, batch 10, 1e6 FLOP/s: backward of the
    # last layer 4*10*3000/1e6 = 0.12 s, then 0.04 s; alpha 0.01 s, 1e5 B/s, N = 2.
    params = [buckets.Param("l0.w", "l0", 1000), buckets.Param("l1.w", "l1", 3000)]
    kw = {"world_size": 2, "alpha": 0.01, "bandwidth": 1e5, "batch": 10, "flops": 1e6}
    tl = overlap.alpha_beta_timeline(params, [1], [1, 0], **kw)  # one bucket per layer
    assert [(s.name, s.start, s.end) for s in tl.layers] == [("l1", 0, pytest.approx(0.12)),
                                                           ("l0", pytest.approx(0.12),
                                                            pytest.approx(0.16))]
    # bucket 0 (12000 B): 2*0.01 + 12000/1e5 = 0.14 s from 0.12; bucket 1 (4000 B): 0.06 s,
    # ready at 0.16 but the link is busy until 0.26
    c0, c1 = tl.comms
    assert (c0.start, c0.end) == (pytest.approx(0.12), pytest.approx(0.26))
    assert (c1.ready, c1.start, c1.end) == (pytest.approx(0.16), pytest.approx(0.26),
                                           pytest.approx(0.32))
    assert tl.total == pytest.approx(0.32)
    assert tl.baseline_total == pytest.approx(0.16 + 0.02 + 16000 / 1e5)


@pytest.mark.parametrize("cap", [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, None])
@pytest.mark.parametrize("alpha, bandwidth, n", [(50e-6, 1e9, 2), (5e-6, 1e11, 8),
                                                 (1e-3, 1e8, 16), (0.0, 1e9, 4)])
def test_timeline_invariants(cap, alpha, bandwidth, n):
    params, order = ddp_buckets.demo_params()
    tl = overlap.alpha_beta_timeline(params, buckets.cap_limits(cap), order, world_size=n, alpha=alpha,
                               bandwidth=bandwidth)
    covered = sorted(i for b in tl.buckets for i in b.params)
    assert covered == list(range(len(params)))
    prev_end = 0.0
    for b, c in zip(tl.buckets, tl.comms):
        assert c.start >= max(tl.param_ready[i] for i in b.params) == c.ready  # never early
        assert c.start >= prev_end  # one link: AllReduces serialised in bucket order
        assert c.end - c.start == pytest.approx(
            costs.alpha_beta_time("all_reduce", b.nbytes, n, alpha, bandwidth))
        prev_end = c.end
    comm = sum(c.end - c.start for c in tl.comms)
    assert tl.total >= max(tl.compute_end, comm) - 1e-15
    assert tl.compute_end == pytest.approx(sum(s.end - s.start for s in tl.layers))
    assert tl.compute_end == pytest.approx(
        4 * ddp_run.DEFAULT_BATCH * sum(p.numel for p in params) / overlap.DEFAULT_FLOPS)


def test_one_bucket_is_the_no_overlap_baseline():
    params, order = ddp_buckets.demo_params()
    # 1 MiB first bucket > model
    tl = overlap.alpha_beta_timeline(params, buckets.cap_limits(None), order)
    assert len(tl.buckets) == 1 and tl.total == pytest.approx(tl.baseline_total)
    nbytes = sum(p.nbytes for p in params)
    assert tl.baseline_total == pytest.approx(tl.compute_end + costs.alpha_beta_time(
        "all_reduce", nbytes, 2, overlap.DEFAULT_ALPHA, overlap.DEFAULT_BANDWIDTH))


def test_buckets_win_for_the_defaults():
    params, order = ddp_buckets.demo_params()
    c = overlap.compare_strategies(params, buckets.cap_limits(0.1), order)
    assert c.best == "buckets" and c.buckets < c.no_overlap < c.per_param
    assert (c.n_per_param, c.n_buckets) == (len(params), 4) == (22, 4)
    # one AllReduce per parameter: 22 latencies of 2(N-1) alpha each at least
    assert c.per_param >= 22 * 2 * overlap.DEFAULT_ALPHA


# ------------------------------------------------------------------------------ frames, SVG


def _texts(svg: str) -> str:
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and root.get("viewBox") == "0 0 1000 600"
    return " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))


def test_frames_step_through_the_backward():
    tl = overlap.alpha_beta_timeline(*ddp_buckets.demo_params()[:1], buckets.cap_limits(0.1), ddp_buckets.demo_params()[1])
    frames = ddp_buckets.build_frames(tl)
    assert len(frames) == len(tl.layers) + 2 == 13
    assert set(frames[0].status) == {"empty"} and set(frames[-1].status) == {"done"}
    assert [f.now for f in frames[1:-1]] == [s.end for s in tl.layers]
    assert frames[-1].final and frames[-1].now == tl.total
    rank = {"empty": 0, "filling": 1, "waiting": 2, "reducing": 3, "done": 4}
    for a, b in itertools.pairwise(frames):  # a bucket never goes back
        assert all(rank[x] <= rank[y] for x, y in zip(a.status, b.status))
        assert all(x <= y for x, y in zip(a.filled, b.filled))
    assert "tầng head tính xong gradient" in frames[1].caption
    assert "AllReduce bắt đầu ngay" in frames[2].caption  # head + b2.fc2 fill B0
    assert "Không chồng lấp" in frames[-1].caption and "tiết kiệm" in frames[-1].caption


def test_svg_valid_vietnamese_and_labelled_with_its_source():
    player = ddp_buckets.player(0.05, presentation=True)
    for f in player.frames:
        text = _texts(f.svg)
        assert unicodedata.is_normalized("NFC", text)
        assert unicodedata.is_normalized("NFC", f.caption)
        assert "mô hình alpha-beta" in text and "Bucket theo thứ tự AllReduce" in text
        assert "thời gian từ lúc bắt đầu backward" in text and "font-size" not in f.svg
    last = _texts(player.frames[-1].svg)
    assert "Không chồng lấp:" in last and "Có chồng lấp:" in last
    assert 'class="dpb-player dpb-present"' in player.to_html()
    cmp = ddp_buckets.comparison_player()
    assert "Vì sao gom gradient thành bucket?" in _texts_any(cmp.frames[0].svg)
    # a build-up in the chapter's order: one way more per frame, all three on the last
    shown = [[w for w in ("1. Một AllReduce sau backward", "2. Mỗi tham số một AllReduce",
                          "3. Bucket") if w in _texts_any(f.svg)] for f in cmp.frames]
    assert [len(s) for s in shown] == [1, 2, 3]
    assert cmp.frames[-1].caption.startswith("3. Bucket") and "Nhanh nhất: bucket" in \
        cmp.frames[-1].caption
    params, order = ddp_buckets.demo_params()
    c = overlap.compare_strategies(params, buckets.cap_limits(0.1), order)
    with pytest.raises(ValueError, match="shown"):
        ddp_buckets.comparison_svg(c, 4)


def _texts_any(svg):
    return " ".join(t.text or "" for t in ET.fromstring(svg).iter() if t.tag.endswith("text"))


def _fake_trace(cap=0.1):
    """A measured trace built by hand from the alpha-beta timeline (for renderer tests)."""
    params, order = ddp_buckets.demo_params()
    tl = overlap.alpha_beta_timeline(params, buckets.cap_limits(cap), order)
    return ddp_run.DdpTrace(cap, None, params, order, (tuple(order),),
                      tuple(b.params for b in tl.buckets),
                      tuple(sum(params[i].numel for i in b.params) for b in tl.buckets),
                      tl.param_ready, tuple(c.start for c in tl.comms),
                      tuple(c.end for c in tl.comms), tl.total, tl.baseline_total,
                      tl.compute_end, 2, 128)


def test_measured_source_is_labelled_and_needs_a_trace():
    traces = {(0.1, None): _fake_trace()}
    player = ddp_buckets.player(0.1, source="measured", traces=traces)
    assert all("ĐO trên máy này" in _texts(f.svg) for f in player.frames)
    with pytest.raises(ValueError, match="Chưa đo cấu hình bucket_cap_mb=0.2"):
        ddp_buckets.player(0.2, source="measured", traces=traces)
    with pytest.raises(ValueError, match="source="):
        ddp_buckets.player(0.1, source="nccl")


def test_rebuild_is_fast():
    t0 = time.perf_counter()
    ddp_buckets.player(1e-6, presentation=True).to_html()  # 22 buckets: the most frames and bars
    ddp_buckets.player(0.02, world_size=64, alpha_us=1000, bandwidth_gbs=0.1).to_html()
    assert time.perf_counter() - t0 < 0.5


def test_live_controls_rebuild_fast():
    pytest.importorskip("ipywidgets")
    box = ddp_buckets.controls(traces={(c, None): _fake_trace(c) for c in ddp_run.CAP_CHOICES_MB})
    ctl = {c.description: c for c in box.children[0].children}
    t0 = time.perf_counter()
    ctl["bucket_cap_mb"].value = 0.02
    ctl["thời gian"].value = "measured"
    assert time.perf_counter() - t0 < 0.5
    assert "Dựng lại" in box.children[1].value
    ctl["bucket đầu"].value = 0.01  # not measured: refused with a message, page kept
    assert "Không vẽ được" in box.children[1].value and "Chưa đo" in box.children[1].value


# ------------------------------------------------------------------------------ real DDP

CONFIGS = ((0.02, None), (0.05, None), (0.1, None), (0.1, 0.02), (None, None))


@pytest.fixture(scope="module")
def recorded():
    return spawn(ddp_run.ddp_bucket_worker, CONFIGS, 32, world_size=2, backend="gloo",
                 warmup=2, repeats=2, output="none")


@pytest.mark.distributed
def test_real_ddp_uses_the_computed_buckets(recorded):
    params, order = ddp_buckets.demo_params()
    rank0, rank1 = recorded
    for tr, tr1 in zip(rank0, rank1):
        limits = buckets.cap_limits(tr.bucket_cap_mb, tr.first_bucket_cap_mb)
        ours = [b.params for b in buckets.assign_buckets(params, limits, order)]
        key = (tr.bucket_cap_mb, tr.first_bucket_cap_mb)
        assert list(tr.buckets) == ours == list(tr1.buckets), key
        # iteration 1: with find_unused_parameters=False DDP puts everything in one bucket,
        # unless bucket_cap_mb_list is given: then it packs in registration order (and reverses
        # the list of buckets). It then rebuilds from the order seen in that iteration.
        initial = buckets.initial_buckets(params, buckets.DdpSetting(*key))
        assert tr.first_iteration_buckets == tuple(b.params for b in initial), key
        if tr.first_bucket_cap_mb is None:
            assert tr.first_iteration_buckets == (tuple(range(len(params))),)
        assert tr.first_ready_order == tuple(order)
        assert list(tr.bucket_numel) == [sum(params[i].numel for i in b) for b in ours]
    n = {(t.bucket_cap_mb, t.first_bucket_cap_mb): len(t.buckets) for t in rank0}
    assert n == {(0.02, None): 8, (0.05, None): 7, (0.1, None): 4, (0.1, 0.02): 5,
                 (None, None): 1}


def test_ddp_run_says_how_it_runs():
    assert ddp_run.describe(3) == launch.describe_mode(3, backend="gloo")


@pytest.mark.distributed
def test_measured_trace_is_consistent(recorded):
    for tr in recorded[0]:
        tl = ddp_run.measured_timeline(tr)
        for b, c in zip(tl.buckets, tl.comms):
            assert c.start >= max(tr.ready_s[i] for i in b.params)  # hook after last gradient
            assert c.end >= c.start
        assert tl.total >= max(c.end for c in tl.comms) and tl.total >= tl.compute_end
        assert [s.end for s in tl.layers] == sorted(s.end for s in tl.layers)
        for f in ddp_buckets.build_frames(tl):
            assert "ĐO trên máy này" in _texts(render.render_frame(f))


# ------------------------------------------------------------- where the small cap lands


def test_last_small_packs_from_the_end_and_reverses():
    params = _p(10, 10, 10, 10, 10)  # 40 bytes each
    first_small = buckets.assign_buckets(params, [40, 100], range(5))
    last_small = buckets.assign_buckets(params, [40, 100], range(5), last_small=True)
    assert [b.params for b in first_small] == [(0,), (1, 2, 3), (4,)]
    assert [b.params for b in last_small] == [(0,), (3, 2, 1), (4,)]
    # the reducer's rule: walk the ready order backwards, then reverse the list of buckets
    back = buckets.assign_buckets(params, [40, 100], [4, 3, 2, 1, 0])
    assert [b.params for b in last_small] == [b.params for b in reversed(back)]
    assert last_small[-1].limit == 40 and last_small[-1].params == (4,)
    assert [b.index for b in last_small] == list(range(len(last_small)))
    with pytest.raises(ValueError, match="last_small"):
        buckets.assign_buckets(params, [40], range(5), last_small=1)


def test_last_small_matches_torch_on_the_reversed_order():
    params, order = ddp_buckets.demo_params()
    limits = buckets.cap_limits(0.1, 0.02)
    ours = buckets.assign_buckets(params, limits, order, last_small=True)
    theirs = _torch_assignment(params, limits, list(reversed(order)))
    assert [b.params for b in ours] == [tuple(b) for b in reversed(theirs[0])]


def test_ddp_setting_checks_and_kwargs():
    s = buckets.DdpSetting(0.1, 0.02, find_unused_parameters=True, static_graph=True)
    assert s.kwargs() == {"bucket_cap_mb_list": [0.02, 0.1], "find_unused_parameters": True,
                          "static_graph": True}
    assert buckets.DdpSetting().kwargs() == {} and buckets.DdpSetting().limits == [MIB, 25 * MIB]
    assert buckets.DdpSetting(0.1, last_bucket_cap=True).call() == (
        "DDP_SET_LAST_BUCKET_CAP=1, DDP(model, bucket_cap_mb=0.1)")
    with pytest.raises(ValueError, match="static_graph"):
        buckets.DdpSetting(static_graph="yes")
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        buckets.DdpSetting(bucket_cap_mb=-1)


def test_rebuild_step_follows_should_rebuild_buckets():
    S = buckets.DdpSetting
    assert buckets.rebuild_step(S()) == 2
    assert buckets.rebuild_step(S(find_unused_parameters=True)) is None
    assert buckets.rebuild_step(S(static_graph=True)) == 3
    assert buckets.rebuild_step(S(find_unused_parameters=True, static_graph=True)) == 3


def test_initial_buckets_follow_compute_bucket_size_limits():
    params, order = ddp_buckets.demo_params()
    S = buckets.DdpSetting
    for setting in (S(), S(0.1), S(0.1, static_graph=True), S(0.1, find_unused_parameters=True),
                    S(0.1, 0.02), S(None, find_unused_parameters=True)):
        cfg = ddp_mod._BucketCapacityConfig.create(
            bucket_cap_mb=setting.bucket_cap_mb, use_python_reducer=False,
            bucket_cap_mb_list=None if setting.first_bucket_cap_mb is None
            else [setting.first_bucket_cap_mb, setting.bucket_cap_mb])
        limits, _ = cfg.compute_bucket_size_limits(setting.static_graph,
                                                   setting.find_unused_parameters)
        tensors = [torch.empty(p.numel) for p in params]
        idx, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(params))
        ours = buckets.initial_buckets(params, setting)
        assert [b.params for b in ours] == [tuple(b) for b in reversed(idx)], setting
    # the small cap of the registration-order packing lands on the last bucket
    first = buckets.initial_buckets(params, S(0.1, 0.02))
    assert first[-1].limit == buckets.cap_limits(0.1, 0.02)[0] and order[-1] in first[-1].params
    # never rebuilt: the first-iteration layout for good
    fu = S(0.1, 0.02, find_unused_parameters=True)
    assert buckets.rebuilt_buckets(params, fu, order) == buckets.initial_buckets(params, fu)


def test_alpha_beta_timeline_with_the_small_cap_last():
    params, order = ddp_buckets.demo_params()
    limits = buckets.cap_limits(0.1, 0.02)
    first = overlap.alpha_beta_timeline(params, limits, order)
    last = overlap.alpha_beta_timeline(params, limits, order, last_small=True)
    assert first.buckets[0].limit == last.buckets[-1].limit == limits[0]
    assert last.buckets[-1].nbytes < first.buckets[-1].nbytes
    assert overlap.bucket_lower_bound(last) < overlap.bucket_lower_bound(first)
    assert last.total > first.total  # the bucket before the last one is still on the link


@pytest.mark.distributed
def test_rebuild_runs_match_the_model():
    params, order = ddp_buckets.demo_params()
    S = buckets.DdpSetting
    settings = (S(0.1, 0.02), S(0.1, 0.02, last_bucket_cap=True),
                S(0.1, find_unused_parameters=True),
                S(0.1, 0.02, static_graph=True), S(0.1))
    runs = ddp_run.rebuild_runs(settings, steps=4, output="none")
    assert [r.rebuilt_at for r in runs] == [2, 2, None, 3, 2]
    for r in runs:
        step = buckets.rebuild_step(r.setting)
        initial = [b.params for b in buckets.initial_buckets(params, r.setting)]
        assert r.rebuilt_at == step and r.ready_order == tuple(order)
        assert all(list(x) == initial for x in r.steps[:(step or 5) - 1])
        assert list(r.steps[-1]) == [b.params for b in
                                     buckets.rebuilt_buckets(params, r.setting, order)]
    import os
    assert ddp_run.LAST_BUCKET_ENV not in os.environ  # the parent's environment is untouched


def test_rebuild_worker_refuses_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        ddp_run.rebuild_worker(0, 2, steps=0)
    with pytest.raises(ValueError, match="DdpSetting"):
        ddp_run.rebuild_worker(0, 2, settings=((0.1, None),))


# ------------------------------------------------------------- the layout of a given step


def test_player_shows_the_layout_of_the_chosen_step():
    params, order = ddp_buckets.demo_params()
    S = buckets.DdpSetting
    cases = {(2, False, None): "rebuilt", (1, False, None): "initial", (1, False, 0.02): "initial",
             (2, True, None): "initial", (5, True, 0.02): "initial", (2, False, 0.02): "rebuilt"}
    for (step, fu, first), kind in cases.items():
        player = ddp_buckets.player(0.1, first, step=step, find_unused_parameters=fu)
        want = buckets.step_buckets(params, S(0.1, first, find_unused_parameters=fu), order, step)
        tl = overlap.alpha_beta_timeline(params, S(0.1, first).limits, order, layout=want,
                                         layout_kind=kind)
        assert len(player.frames) == len(tl.layers) + 2
        text = _texts(player.frames[0].svg)
        assert ("bố cục bước 1" in text) == (kind == "initial"), (step, fu, first)
        assert f"{len(want)} bucket" in player.frames[0].caption
        assert player.frames[-1].caption == ddp_buckets.build_frames(tl)[-1].caption
    # step 1 with the defaults: one bucket, no overlap; the title says so
    one = ddp_buckets.player(0.1, step=1)
    assert "bước 1: một bucket" in _texts(one.frames[0].svg)
    assert "không chồng lấp" in one.frames[0].caption
    # bucket_cap_mb_list in step 1: the small cap sits on the LAST bucket, and the title says so
    lst = _texts(ddp_buckets.player(0.1, 0.02, step=1).frames[0].svg)
    assert "bucket cuối 0,02 MiB" in lst
    assert "bucket đầu 0,02 MiB" in _texts(ddp_buckets.player(0.1, 0.02).frames[0].svg)


def test_initial_layout_timeline_of_bucketnet():
    # packed from the parameters declared first, the cuts fall elsewhere than once rebuilt:
    # B0 holds b2.fc2.bias, head.weight, head.bias and is ready only after b2.fc2
    params, order = ddp_buckets.demo_params()
    S = buckets.DdpSetting
    first = buckets.initial_buckets(params, S(0.1, 0.02))
    assert [params[i].name for i in first[0].params] == ["b2.fc2.bias", "head.weight", "head.bias"]
    tl = overlap.alpha_beta_timeline(params, S(0.1, 0.02).limits, order, layout=first,
                                     layout_kind="initial")
    rebuilt = overlap.alpha_beta_timeline(params, S(0.1, 0.02).limits, order)
    assert tl.comms[0].ready == tl.layers[1].end > rebuilt.comms[0].ready == tl.layers[0].end
    with pytest.raises(ValueError, match="layout phải chứa"):
        overlap.alpha_beta_timeline(params, [1], order, layout=first[:-1])
    with pytest.raises(ValueError, match="layout_kind"):
        overlap.alpha_beta_timeline(params, [1], order, layout_kind="bước 1")


def test_measured_player_refuses_a_layout_it_did_not_measure():
    traces = {(0.1, None): _fake_trace()}
    for kw in (dict(step=1), dict(find_unused_parameters=True)):
        with pytest.raises(ValueError, match="Số đo chỉ có cho bố cục đã dựng lại"):
            ddp_buckets.player(0.1, source="measured", traces=traces, **kw)
    with pytest.raises(ValueError, match="step phải là số nguyên"):
        ddp_buckets.player(0.1, step=0)
