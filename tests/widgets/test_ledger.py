"""The VRAM ledger calculator: preset sizes, bars equal to ``memory.vram_ledger``, fit verdicts,
the SVG, and (distributed) measured state bytes next to the prediction."""

import time
import unicodedata
import xml.etree.ElementTree as ET

import pytest
import torch
from dpbook import memory, shapes
from dpbook.models import MLP, num_params
from dpbook.widgets import ledger
from dpbook.widgets.ledger import render
from dpbook.style import PALETTE

GB = 1e9
LLAMA_7B = 6_738_415_616
GPT2_SMALL = 124_439_808


def test_preset_parameter_counts_are_the_published_ones():
    p = shapes.presets()
    assert p["llama-7b"].num_params == LLAMA_7B
    assert p["gpt2-124m"].num_params == GPT2_SMALL  # tied embeddings: no separate head
    assert p["llama-13b"].num_params == 13_015_864_320
    assert p["llama-70b"].num_params == 68_976_648_192  # Llama 2 70B, grouped-query attention
    assert p["mlp"].num_params == num_params(MLP()) == 2788
    # the largest layer unit: one LLaMA-7B layer (attention + SwiGLU MLP + 2 RMSNorm)
    assert p["llama-7b"].largest_unit == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    # the root unit: embedding, final norm and the untied head
    assert p["llama-7b"].root_unit == 2 * 32000 * 4096 + 4096
    assert p["mlp"].largest_unit == 32 * 32 + 32 and p["mlp"].root_unit == 32 * 4 + 4


@pytest.mark.parametrize("key", sorted(shapes.SHAPES))
def test_meta_device_model_has_the_closed_form_count(key):
    model = shapes.meta_model(shapes.SHAPES[key][1])
    assert all(p.device == torch.device("meta") for p in model.parameters())
    assert num_params(model) == shapes.num_params_of(shapes.SHAPES[key][1])


@pytest.mark.parametrize("precision", memory.PRECISIONS)
@pytest.mark.parametrize("phase", memory.PHASES)
def test_bars_are_vram_ledger(precision, phase):
    p = shapes.presets()["llama-13b"]
    frames = ledger.ledger_frames("llama-13b", strategies=memory.STRATEGIES, precision=precision,
                             optimizer="sgd_momentum", phase=phase, shard_size=4,
                             activation_bytes=3 * GB)
    assert [f.world_size for f in frames] == list(ledger.WORLD_SIZES)
    for f in frames:
        for bar, strategy in zip(f.bars, memory.STRATEGIES):
            shard = min(4, f.world_size) if strategy == "HYBRID_SHARD" else None
            assert bar.ledger == memory.vram_ledger(
                p.num_params, f.world_size, strategy, precision=precision,
                optimizer="sgd_momentum", phase=phase, shard_size=shard,
                largest_unit_params=p.largest_unit, root_unit_params=p.root_unit,
                activation_bytes=3 * GB)


def test_drawn_heights_are_proportional_to_the_ledger():
    frames = ledger.ledger_frames("llama-7b")
    top = render.axis_top(frames)
    frame = frames[3]  # N = 8: every bar under the top of the axis
    assert frame.world_size == 8 and all(b.ledger.total < top for b in frame.bars)
    root = ET.fromstring(render.render(frame, top))
    scale = (render.PLOT_Y1 - render.PLOT_Y0) / top
    for field, colour in (("params", "blue"), ("grads", "orange"), ("optimizer", "green")):
        heights = [float(r.get("height")) for r in root.iter("{http://www.w3.org/2000/svg}rect")
                   if r.get("fill") == PALETTE[colour] and r.get("rx") == "0"]
        expected = [getattr(b.ledger, field) * scale for b in frame.bars]
        assert heights == pytest.approx(expected, abs=0.06)


def test_llama_7b_mixed_adam_fit_verdicts():
    by_n = {f.world_size: {b.label: b for b in f.bars} for f in ledger.ledger_frames("llama-7b")}
    ddp = by_n[8]["DDP"]
    # 2 + 2 + 12 bytes per parameter of state, and DDP's bucket copy of the bf16 gradients (2)
    assert ddp.ledger.state == 16 * LLAMA_7B and ddp.ledger.buffers == ddp.ledger.grads
    assert ddp.ledger.total == 18 * LLAMA_7B and round(ddp.ledger.total / GB, 1) == 121.3
    assert [c.name for c in memory.CARDS] == ["RTX 4090", "A100 40GB", "H100 80GB", "H200"]
    assert ddp.fits == (False, False, False, True)  # RTX 4090, A100 40GB, H100 80GB no; H200 yes
    view = ledger.ledger_frames("llama-7b", world_sizes=(8,), bucket_view=True)[0].bars[0]
    assert view.ledger.buffers == 0 and view.ledger.total == 16 * LLAMA_7B
    full = by_n[8]["FULL_SHARD"]
    # phase="step" (the default): 16 P / N, plus the gathered bf16 layer being computed and the
    # root unit (embedding, norm, head), unsharded for the whole step
    pre = shapes.presets()["llama-7b"]
    assert full.ledger.state == 16 * LLAMA_7B / 8 + 2 * (pre.largest_unit + pre.root_unit) * 7 / 8
    assert all(full.fits)  # 14.3 GB per rank, even on 24 GB
    assert by_n[2]["FULL_SHARD"].fits == (False, False, True, True)
    assert ledger.verdict(ddp) == "DDP cần 121 GB/rank, chỉ vừa H200"
    assert ledger.verdict(full) == "FULL_SHARD cần 14,3 GB/rank, vừa mọi GPU"
    assert ledger.verdict(by_n[4]["ZeRO-1"]) == "ZeRO-1 cần 47,2 GB/rank, vừa từ H100 80GB trở lên"
    # ZeRO-2 on 8 GPUs: 25,3 GB, just above the 25,1 GB PyTorch can allocate on an RTX 4090
    assert by_n[8]["ZeRO-2"].fits == (False, True, True, True)
    big = ledger.ledger_frames("llama-70b", world_sizes=(8,))[0].bars[0]
    assert ledger.verdict(big).endswith("không vừa GPU nào")
    assert "DDP cần 121 GB/rank, chỉ vừa H200" in ledger.ledger_frames("llama-7b")[3].caption


def test_fits_compares_with_what_pytorch_can_allocate_on_each_card():
    h100 = memory.card("H100 80GB")
    assert ledger.fits(h100.usable_bytes, (h100,)) == (True,)
    assert ledger.fits(h100.usable_bytes + 1, (h100,)) == (False,)
    assert ledger.fits(82e9, (h100,)) == (True,)  # more than 80e9 B: "80 GB" is 80 GiB


def test_hybrid_shard_group_is_capped_by_the_world():
    f = {fr.world_size: fr.bars[-1] for fr in ledger.ledger_frames("llama-7b")}
    assert f[4].shard_size == 4 and f[16].shard_size == 8 and f[64].shard_size == 8
    assert f[64].ledger == f[8].ledger  # replicas beyond one node do not shrink the state
    with pytest.raises(ValueError, match="HYBRID_SHARD"):
        ledger.ledger_frames("llama-7b", world_sizes=(12,))


@pytest.mark.parametrize("kwargs, word", [
    ({"preset": "llama-3"}, "preset"),
    ({"strategies": ("DDP", "ZeRO-4")}, "strategy"),
    ({"strategies": ("DDP", "DDP")}, "strategies"),
    ({"strategies": ()}, "strategies"),
    ({"world_sizes": ()}, "world_sizes"),
    ({"world_sizes": (0,)}, "world_size"),
    ({"precision": "fp8"}, "precision"),
    ({"activation_bytes": -1}, "activation_bytes"),
    ({"cards": (memory.card("H200"), 80)}, "cards"),
])
def test_bad_inputs_say_what_is_allowed(kwargs, word):
    with pytest.raises(ValueError, match=word) as err:
        ledger.ledger_frames(**kwargs)
    assert any(w in str(err.value) for w in ("không hợp lệ", "phải", "cần", "rỗng"))


def _texts(svg):
    return [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]


def test_svg_is_valid_and_vietnamese():
    frames = ledger.ledger_frames("gpt2-124m", strategies=memory.STRATEGIES, activation_bytes=GB)
    top = render.axis_top(frames)
    for f in frames:
        svg = render.render(f, top)
        assert unicodedata.is_normalized("NFC", svg) and unicodedata.is_normalized("NFC", f.caption)
        texts = _texts(svg)
        for label in ("tham số", "gradient", "trạng thái bộ tối ưu", "activation", "GB mỗi rank",
                      "✓ vừa", "RTX 4090", "Vừa GPU?"):
            assert label in texts, label
    # a 70B model on 2 GPUs: bars broken at the top of the axis, totals written above them
    frames = ledger.ledger_frames("llama-70b")
    texts = _texts(render.render(frames[1], render.axis_top(frames)))
    assert "↑ 1242 GB" in texts and "✗ không" in texts and "H200" in texts
    assert "bộ đệm bucket của DDP" in texts  # its own row: DDP's copy of the gradients
    # each card's line: its name above, what PyTorch can allocate there (GB) below
    assert "H100 80GB" in texts and "84,7 GB" in texts and "25,1 GB" in texts


def test_player_builds_fast_for_the_largest_setting():
    t0 = time.perf_counter()
    player = ledger.player("llama-70b", strategies=memory.STRATEGIES,
                             world_sizes=(1, 2, 4, 8, 16, 32, 64, 128), activation_bytes=GB)
    html = player.to_html()
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, elapsed
    assert len(player.frames) == 8 and "Sổ kế toán VRAM" in html


def test_live_controls_build():
    box = ledger.controls()
    status = box.children[1].value
    assert status.startswith("Dựng lại"), status


@pytest.mark.distributed
def test_measured_state_equals_the_ledger():
    from dpbook import launch, measure

    results = {s: launch.spawn(measure.measure_step, ledger.measured_parallel(s), world_size=2,
                               backend="gloo", timeout=180, output="none")[0]
               for s in ("DDP", "SHARD_GRAD_OP")}
    for strategy, predicted, measured in ledger.compare(results):
        assert measured == predicted, strategy
    frame = ledger.measured_frame(results)
    assert [b.label for b in frame.bars] == ["dự đoán", "đo được"] * 2
    texts = _texts(render.render(frame))
    # DDP: 16P of state and 4P of buckets, measured and predicted (P = 2788)
    assert "55,8 KB" in texts and "22,3 KB" in texts and "SHARD_GRAD_OP" in texts
    assert "bộ đệm bucket của DDP" in texts
