"""The FSDP lifecycle widget and the trace it replays.

Every trace here is recorded from a real run (gloo, CPU) in the test itself: ``MLP(16, 32,
depth=3, 4)``, whose blocks hold 544, 1056, 1056 parameters and whose root owns the head (132
parameters). All sizes divide by the shard group (2), so FSDP adds no padding and the bytes of
every collective equal a unit's parameter bytes exactly.
"""

import itertools
import time
import unicodedata
import xml.etree.ElementTree as ET

import pytest
import torch
from dpbook import memory
from dpbook.tracing import lifecycle
from dpbook.models import build_mlp
from dpbook.widgets import fsdp
from dpbook.style import PALETTE

DEFAULT = "FULL_SHARD (mặc định PyTorch: root không chia mảnh lại)"
BLOCK_PARAMS = [16 * 32 + 32, 32 * 32 + 32, 32 * 32 + 32]
ROOT, L = 3, 3  # index of the root unit, number of blocks
P = sum(BLOCK_PARAMS) + 32 * 4 + 4


# ------------------------------------------------------------- without processes

@pytest.mark.parametrize("kwargs, word", [
    ({"strategy": "ZeRO-3"}, "strategy"),
    ({"strategy": "FULL_SHARD", "depth": 0}, "depth"),
    ({"strategy": "FULL_SHARD", "depth": 7}, "depth"),
    ({"strategy": "FULL_SHARD", "reshard_root": "có"}, "reshard_root"),
])
def test_bad_inputs_are_refused_in_vietnamese(kwargs, word):
    strategy = kwargs.pop("strategy")
    with pytest.raises(ValueError, match=word) as err:
        lifecycle.record_trace(strategy, **kwargs)
    assert any(w in str(err.value) for w in ("không hợp lệ", "phải", "tối đa"))


def test_controls_need_a_trace():
    with pytest.raises(ValueError, match="ít nhất một trace"):
        fsdp.controls({})


def test_trace_log_keeps_commlog_behaviour_and_ignores_hooks_outside_it():
    log = lifecycle.TraceLog(lambda: (True,))
    log.mark("forward_pre", 0)  # outside the with block: a warm-up step, not recorded
    with log:
        log.mark("step_begin")
        log.mark("forward_pre", 0)
    assert log.records == [] and log.volume().total == 0
    assert [(e.index, e.kind, e.phase, e.unsharded) for e in log.events] == \
        [(0, "step_begin", "rest", (True,)), (1, "forward_pre", "forward", (True,))]


def test_prefetch_arguments_are_checked_before_any_process_starts():
    with pytest.raises(ValueError, match="FSDP2"):
        lifecycle.record_trace("NO_SHARD", prefetch=1)
    with pytest.raises(ValueError, match="prefetch"):
        lifecycle.record_trace("FULL_SHARD", prefetch=-1)
    with pytest.raises(ValueError, match="fully_shard"):
        lifecycle.set_prefetch([torch.nn.Linear(2, 2)], 1, 1)
    with pytest.raises(ValueError, match="forward"):
        lifecycle.set_prefetch([], -1, 0)
    with pytest.raises(ValueError, match="ít nhất một rank"):
        lifecycle.trace_from_results("FULL_SHARD", True, [])


def test_a_trace_label_names_its_prefetch_and_keeps_the_old_labels():
    units = (lifecycle.Unit("Block 0", 1, 4),)
    plain = lifecycle.Trace("FULL_SHARD", True, "", "FSDP2", 2, 2, units, ())
    assert plain.prefetch == 0 and plain.label == "FULL_SHARD"
    default = lifecycle.Trace("FULL_SHARD", False, "", "FSDP2", 2, 2, units, ())
    assert default.label == "FULL_SHARD (mặc định PyTorch: root không chia mảnh lại)"
    two = lifecycle.Trace("FULL_SHARD", True, "", "FSDP2", 2, 2, units, (), 2)
    assert two.label == "FULL_SHARD, gom trước tường minh 2 đơn vị"


def test_fmt_bytes():
    assert fsdp.fmt_bytes(22304) == "22\u202f304 B" and fsdp.fmt_bytes(528) == "528 B"
    assert len(fsdp.fmt_bytes(1_234_567)) == len("1 234 567 B")  # one character per separator


# ------------------------------------------------------------- recorded traces

@pytest.fixture(scope="module")
def traces():
    return lifecycle.record_traces()


def _collectives(t, collective=None, phase=None, rank=0):
    return [e for e in t.ranks[rank].events if e.kind == "collective"
            and collective in (None, e.collective) and phase in (None, e.phase)]


def _index(t, kind, unit, phase=None):
    return next(e.index for e in t.ranks[0].events
                if e.kind == kind and e.unit == unit and phase in (None, e.phase))


def _states(frames, unit, rank=0):
    return [s for s, _ in itertools.groupby(f.ranks[rank].units[unit].state for f in frames)]


@pytest.mark.distributed
def test_units_are_the_blocks_and_the_root(traces):
    model = build_mlp()
    expected = [4 * sum(p.numel() for p in b.parameters()) for b in model.blocks]
    expected.append(4 * sum(p.numel() for p in model.head.parameters()))
    for t in traces.values():
        assert [u.param_bytes for u in t.units] == expected == [4 * n for n in BLOCK_PARAMS] + [528]
        assert t.num_params == P
    assert {t.label: t.world_size for t in traces.values()} == {
        "FULL_SHARD": 2, "SHARD_GRAD_OP": 2, "NO_SHARD": 2, "HYBRID_SHARD": 4, DEFAULT: 2}
    assert traces["NO_SHARD"].api == "FSDP1" and traces["FULL_SHARD"].api == "FSDP2"


@pytest.mark.distributed
def test_every_collective_carries_its_units_parameter_bytes(traces):
    for t in traces.values():
        for rt in t.ranks:
            for e in _collectives(t, rank=rt.rank):
                full = t.units[e.unit].param_bytes
                assert e.nbytes == (full // t.shard_size if e.collective == "all_reduce" else full)
        # the optimizer step communicates nothing (each rank updates what it holds)
        assert not [e for e in t.ranks[0].events if e.kind == "collective"
                    and e.phase == "optimizer"]


@pytest.mark.distributed
@pytest.mark.parametrize("label", ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", DEFAULT])
def test_forward_all_gathers_root_first_then_blocks_in_order(traces, label):
    t = traces[label]
    ag = _collectives(t, "all_gather", "forward")
    assert [e.unit for e in ag] == [ROOT, 0, 1, 2]
    # Mapping by bytes agrees with the hooks: each unit's AllGather runs inside its pre-forward.
    for e in ag:
        # the root's AllGather comes before Block 0 starts; a block's, before it computes
        end = _index(t, "forward_pre", 0) if e.unit == ROOT else \
            _index(t, "forward_compute", e.unit)
        assert _index(t, "forward_pre", e.unit) < e.index < end
    assert all(e.group_size == 2 for e in ag)


@pytest.mark.distributed
@pytest.mark.parametrize("label", ["FULL_SHARD", "HYBRID_SHARD"])
def test_full_shard_backward_gathers_again_in_reverse_then_reduce_scatters(traces, label):
    t = traces[label]
    ag = [e.unit for e in _collectives(t, "all_gather", "backward")]
    rs = [e.unit for e in _collectives(t, "reduce_scatter", "backward")]
    assert ag == [ROOT, 2, 1, 0]  # reshard_after_forward=True: the root is gathered again too
    assert [u for u in rs if u != ROOT] == [2, 1, 0] and sorted(rs) == [0, 1, 2, ROOT]
    for k in range(L + 1):
        assert _index(t, "collective", k, "backward") < next(
            e.index for e in _collectives(t, "reduce_scatter") if e.unit == k)


@pytest.mark.distributed
def test_root_detail_pytorch_default_keeps_the_root_gathered(traces):
    t = traces[DEFAULT]
    assert t.wrapper == "apply_fsdp2(model, reshard_after_forward=None)"
    assert [e.unit for e in _collectives(t, "all_gather", "backward")] == [2, 1, 0]
    frames = fsdp.lifecycle_frames(t)
    # never freed between its forward AllGather and its ReduceScatter
    assert "freed" not in _states(frames, ROOT)
    assert "freed" in _states(fsdp.lifecycle_frames(traces["FULL_SHARD"]), ROOT)


@pytest.mark.distributed
def test_shard_grad_op_has_no_backward_all_gather(traces):
    t = traces["SHARD_GRAD_OP"]
    assert _collectives(t, "all_gather", "backward") == []
    assert [e.unit for e in _collectives(t, "all_gather")] == [ROOT, 0, 1, 2]
    assert len(_collectives(t, "reduce_scatter")) == L + 1


@pytest.mark.distributed
def test_no_shard_all_reduces_each_unit_once(traces):
    t = traces["NO_SHARD"]
    coll = _collectives(t)
    assert {e.collective for e in coll} == {"all_reduce"}
    assert sorted(e.unit for e in coll) == [0, 1, 2, ROOT]
    assert all(e.phase == "backward" and e.group_size == 2 for e in coll)


@pytest.mark.distributed
def test_hybrid_reduce_scatters_in_the_node_then_all_reduces_shards_across(traces):
    t = traces["HYBRID_SHARD"]
    assert t.shard_size == 2 and t.world_size == 4
    pairs = [(e.collective, e.unit) for e in _collectives(t, phase="backward")
             if e.collective != "all_gather"]
    assert pairs == [(c, u) for u in (2, 1, ROOT, 0) for c in ("reduce_scatter", "all_reduce")]
    ar = _collectives(t, "all_reduce")
    assert [e.nbytes for e in ar] == [4224 // 2, 4224 // 2, 528 // 2, 2176 // 2]
    # measured groups: shard inside (0, 1) and (2, 3); replicas (0, 2) and (1, 3)
    for rt in t.ranks:
        node = (0, 1) if rt.rank < 2 else (2, 3)
        replicas = (0, 2) if rt.rank % 2 == 0 else (1, 3)
        for e in _collectives(t, rank=rt.rank):
            assert e.group_ranks == (replicas if e.collective == "all_reduce" else node)
    assert [fsdp.shard_position(t, r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.distributed
def test_mapping_refuses_a_collective_no_unit_explains(traces):
    t = traces["FULL_SHARD"]
    wrong = tuple(lifecycle.Unit(u.name, u.num_params, u.param_bytes + 4) for u in t.units)
    with pytest.raises(ValueError, match="Không gán được all_gather"):
        lifecycle.assign_units(t.ranks[0].events, wrong, t.shard_size)


@pytest.mark.distributed
def test_frame_states_full_shard(traces):
    frames = fsdp.lifecycle_frames(traces["FULL_SHARD"])
    fwd = ["sharded", "gathered", "computing", "freed", "sharded"]
    bwd = ["gathered", "computing", "gathered", "reduce_scattered"]
    for k in (1, 2):
        assert _states(frames, k) == fwd + bwd + ["sharded", "updating", "sharded"]
    # Block 0 is reduce-scattered last, right before the optimizer step
    assert _states(frames, 0) == fwd + bwd + ["updating", "sharded"]
    assert _states(frames, ROOT) == fwd[:4] + bwd + ["sharded", "updating", "sharded"]
    first, opt, last = frames[0], frames[-2], frames[-1]
    assert first.event.kind == "step_begin" and last.event.kind == "step_end"
    for f, state in ((first, "sharded"), (opt, "updating"), (last, "sharded")):
        assert {u.state for r in f.ranks for u in r.units} == {state}
    assert {u.grad for u in last.ranks[0].units} == {"reduced"}
    # every rank goes through the same states (SPMD), each from its own events
    assert all(f.ranks[0].units == f.ranks[1].units for f in frames)


@pytest.mark.distributed
def test_frame_states_other_strategies(traces):
    sgo = fsdp.lifecycle_frames(traces["SHARD_GRAD_OP"])
    for k in range(L + 1):
        assert "freed" not in _states(sgo, k)
        assert _states(sgo, k)[:5] == ["sharded", "gathered", "computing", "gathered", "computing"]
    no = fsdp.lifecycle_frames(traces["NO_SHARD"])
    assert {u.params for f in no for r in f.ranks for u in r.units} == {"full"}
    assert all("all_reduced" in _states(no, k) for k in range(L + 1))
    hy = fsdp.lifecycle_frames(traces["HYBRID_SHARD"])
    assert all(["reduce_scattered", "all_reduced"] == [s for s in _states(hy, k)
               if s in ("reduce_scattered", "all_reduced")] for k in range(L + 1))


@pytest.mark.distributed
def test_memory_bar_agrees_with_measure_and_ledger(traces):
    for t in traces.values():
        frames = fsdp.lifecycle_frames(t)
        hybrid = {"shard_size": 2} if t.strategy == "HYBRID_SHARD" else {}
        rest = memory.vram_ledger(P, t.world_size, t.strategy, phase="rest", **hybrid)
        for r, rt in enumerate(t.ranks):
            # before the step: parameters + Adam state, gradients set to None
            assert frames[0].ranks[r].memory.total == rt.state_before.total \
                == rest.params + rest.optimizer
            # after optimizer.step(): the resting level of the ledger, as measure sees it
            assert frames[-1].ranks[r].memory.total == rt.state_after.total == rest.state
    n = 2
    assert fsdp.lifecycle_frames(traces["FULL_SHARD"])[-1].ranks[0].memory.total \
        == 16 * P / n
    assert fsdp.lifecycle_frames(traces["NO_SHARD"])[-1].ranks[0].memory.total == 16 * P


@pytest.mark.distributed
def test_memory_bar_levels_in_closed_form(traces):
    frames = fsdp.lifecycle_frames(traces["FULL_SHARD"])
    start = 12 * P / 2
    ag1 = next(f for f in frames if f.event.collective == "all_gather" and f.event.unit == 1
               and f.phase == "forward")
    # forward: the root (kept until the end of forward) and Block 1 are full on top of the shards
    assert ag1.ranks[0].memory.total == start + 4 * (1056 + 132)
    assert ag1.ranks[0].memory.gathered == 4 * (1056 + 132)
    freed = next(f for f in frames if f.event.kind == "forward_post" and f.event.unit == 1)
    assert freed.ranks[0].memory.total == start + 4 * 132
    sgo = fsdp.lifecycle_frames(traces["SHARD_GRAD_OP"])
    end_fwd = [f for f in sgo if f.phase == "forward"][-1]
    # SHARD_GRAD_OP keeps every unit full after forward: shards + 4P of full parameters
    assert end_fwd.ranks[0].memory.total == start + 4 * P
    # the bar rises and falls: its peak is above both ends
    peak = max(f.ranks[0].memory.total for f in frames)
    assert peak > frames[-1].ranks[0].memory.total > frames[0].ranks[0].memory.total


@pytest.mark.distributed
def test_svg_is_valid_with_vietnamese_labels_and_palette_colours(traces):
    allowed = {c.lower() for c in PALETTE.values()} | {"#111111", "#333333", "#ffffff", "none"}
    for t in traces.values():
        frames = fsdp.lifecycle_frames(t)
        for i in (0, len(frames) // 2, len(frames) - 1):
            svg = fsdp.render.render(t, frames, i)
            root = ET.fromstring(svg)
            assert root.tag.endswith("svg") and "font-size" not in svg
            assert unicodedata.normalize("NFC", svg) == svg
            colours = {el.get(a).lower() for el in root.iter() for a in ("fill", "stroke")
                       if el.get(a)}
            assert colours <= allowed, colours - allowed
        html = fsdp.player_for(t).to_html()
        for word in ("Bộ nhớ mỗi rank", "Lượt xuôi", "Lượt ngược", "Rank 0", "Bước tối ưu"):
            assert word in html
        assert all(unicodedata.normalize("NFC", f.caption) == f.caption and f.caption
                   for f in frames)
    text = fsdp.player_for(traces["FULL_SHARD"]).to_html()
    for word in ("giải phóng", "tính gradient", "ReduceScatter", "AllGather", "prefetch",
                 "gradient chưa rút gọn", "gradient đã rút gọn (phần của rank)", "đơn vị"):
        assert word in text
    # the labels use the glossary's words, not English verbs or the English "unit"
    for word in ("chưa reduce", "đã reduce", "đã AllReduce", " unit"):
        assert word not in text


@pytest.mark.distributed
def test_live_rebuild_of_the_largest_setting_is_fast(traces):
    t = traces["HYBRID_SHARD"]  # 4 ranks: the most cells and frames
    fsdp.player_for(t).to_html()  # warm caches
    t0 = time.perf_counter()
    html = fsdp.player_for(t, presentation=True).to_html()
    assert time.perf_counter() - t0 < 0.5
    assert "dpb-present" in html
    box = fsdp.controls(traces)
    strategy = box.children[0].children[0]
    assert list(strategy.options) == list(traces)
    strategy.value = "HYBRID_SHARD"
    assert "Dựng lại" in box.children[1].value
