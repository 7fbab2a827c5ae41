"""Section 4.2.3 (FSDP in full): ``dpbook.pages.fsdp_in_full``, ``dpbook.pages.fsdp_in_full`` and
``dpbook.models.transformer``."""

import pytest
import torch

from dpbook.pages import fsdp_in_full
from dpbook import launch, train
from dpbook.models import num_params
from dpbook.models.transformer import TinyTransformer, build_tiny_transformer, random_tokens


# ---------------------------------------------------------------- pure functions, one process

def test_tiny_transformer_shapes_size_and_causality():
    model = build_tiny_transformer()
    x, y = random_tokens(3)
    assert x.shape == y.shape == (3, 16) and torch.equal(x[:, 1:], y[:, :-1])
    logits = model(x)
    assert logits.shape == (3, 16, 64)
    assert num_params(model) == 29632
    # causal: changing the last token leaves the logits of the earlier positions unchanged
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 64
    out2 = model(x2)
    torch.testing.assert_close(out2[:, :-1], logits[:, :-1])
    assert not torch.allclose(out2[:, -1], logits[:, -1])
    # same seed, same weights; other seed, other weights
    same, other = build_tiny_transformer().state_dict(), build_tiny_transformer(seed=1).state_dict()
    assert all(torch.equal(v, same[k]) for k, v in model.state_dict().items())
    assert not torch.equal(other["head.weight"], same["head.weight"])


def test_tiny_transformer_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_heads"):
        TinyTransformer(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="depth"):
        TinyTransformer(depth=0)


def test_unit_params_gives_each_parameter_to_its_deepest_unit():
    model = build_tiny_transformer()
    got = fsdp_in_full.unit_params(model, ["", "blocks.0", "blocks.1"])
    assert got == {"": 4224, "blocks.0": 12704, "blocks.1": 12704}
    nested = fsdp_in_full.unit_params(model, ["", "blocks.0", "blocks.0.ff.fc1"])
    assert nested == {"": 4224 + 12704, "blocks.0": 12704 - 4224, "blocks.0.ff.fc1": 4224}
    assert sum(nested.values()) == num_params(model)
    with pytest.raises(ValueError, match="không thuộc"):
        fsdp_in_full.unit_params(model, ["blocks.0"])


def test_wrap_policy_and_units_of_a_plain_model():
    assert fsdp_in_full.fsdp_units(build_tiny_transformer()) == []
    with pytest.raises(ValueError, match="policy"):
        fsdp_in_full.wrap_policy("layer")
    with pytest.raises(ValueError, match="min_num_params"):
        fsdp_in_full.wrap_policy("size", min_num_params=0)


def test_step_needs_a_world_size_that_divides_the_global_batch():
    with pytest.raises(ValueError, match="GLOBAL_BATCH"):
        fsdp_in_full._step_on(None, None, 0, 0, 3)


# ---------------------------------------------------------------- several processes (gloo)

@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("dcp"))
    return ckpt, launch.spawn(fsdp_in_full.practice_tour, ckpt, world_size=2, backend="gloo",
                              timeout=240, output="none")


@pytest.mark.distributed
def test_wrap_policies_choose_the_units(tour):
    _, res = tour
    for r in res:
        w = r["wrap"]
        assert w["size"]["units"] == {"": 4480, "blocks.0.attn": 4224, "blocks.0.ff.fc1": 4224,
                                      "blocks.0.ff.fc2": 4128, "blocks.1.attn": 4224,
                                      "blocks.1.ff.fc1": 4224, "blocks.1.ff.fc2": 4128}
        by_block = {"": 4224, "blocks.0": 12704, "blocks.1": 12704}
        assert w["block"]["units"] == w["transformer"]["units"] == w["fully_shard"]["units"]
        assert w["block"]["units"] == by_block
        for name, v in w.items():
            assert v["local_param_bytes"] == 4 * 29632 // 2, name  # half of the fp32 weights
            assert v["forward_all_gathers"] == len(v["units"]), name  # one per unit
            # the wrapping changes where parameters live, not what is computed
            assert v["loss"] == w["block"]["loss"], name
            for k, t in v["state"].items():
                torch.testing.assert_close(t, w["block"]["state"][k], rtol=0, atol=1e-6)
        assert "FullyShardedDataParallel" in w["block"]["tree"]


@pytest.mark.distributed
def test_mixed_precision_computes_in_bf16_and_keeps_fp32_masters(tour):
    _, res = tour
    for r in res:
        for method, m in r["mp"].items():
            assert m["seen"]["qkv input"] == m["seen"]["qkv weight"] == "bfloat16", method
            assert m["seen"]["output"] == "bfloat16"
            assert m["stored"] == m["full_state"] == ["float32"]
            assert m["all_gather_bytes_per_param"] == 2.0  # bf16 on the wire
            assert m["reduce_scatter_bytes_per_param"] == 4.0  # gradients reduced in fp32
        assert r["mp"]["fsdp1"]["seen"]["buffer pos"] == "bfloat16"  # buffer_dtype
        assert r["mp"]["fsdp2"]["seen"]["buffer pos"] == "float32"  # FSDP2 leaves buffers alone


@pytest.mark.distributed
def test_meta_init_and_equivalence_with_ddp(tour):
    _, res = tour
    reference = train.fit(0, 1, None, steps=4, batch_size=16)
    for r in res:
        meta = r["meta"]
        assert meta["all_meta"] and meta["local_param_bytes"] == 4 * meta["num_params"] // 2
        assert not any(meta["reset_equal"].values())
        assert all(meta["loaded_equal"].values())
        assert len(r["vs_ddp"]) == 3
        for out in r["vs_ddp"].values():
            for k, v in reference["state"].items():
                torch.testing.assert_close(out["state"][k], v, rtol=0, atol=1e-12)


@pytest.mark.distributed
def test_checkpoint_reshards_and_loads_without_process_group(tour):
    ckpt, res = tour
    save = res[0]["save"]
    assert save["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert save["local_shape"] == (16, 16)
    (one,) = launch.spawn(fsdp_in_full.resume_checkpoint, ckpt, world_size=1, backend="gloo",
                          timeout=120, output="none")
    assert one["local_shape"] == (32, 16)
    for k, v in save["saved"]["model"].items():
        assert torch.equal(one["loaded"]["model"][k], v)
    for k, st in save["saved"]["optim"]["state"].items():
        for name, v in st.items():
            assert torch.equal(one["loaded"]["optim"]["state"][k][name], v), (k, name)
    for k, v in save["after_next_step"].items():
        torch.testing.assert_close(one["after_next_step"][k], v, rtol=0, atol=1e-12)
    model = fsdp_in_full.load_for_inference(ckpt)
    with torch.no_grad():
        assert torch.equal(model(fsdp_in_full.probe_inputs()), save["preds"])


def test_dcp_save_on_a_gloo_rank_never_touches_cuda(tmp_path, monkeypatch):
    """Review D10: with CUDA visible, DCP's default writer copies ahead through
    ``torch.cuda.current_stream()`` even on a gloo CPU rank (an unwanted CUDA context; a failure
    in gpu-check's no-CUDA fallbacks). ``cpu_safe_writer`` turns that off on CPU ranks. Here the
    process pretends to be a CUDA build whose streams refuse to be touched."""
    import torch.distributed as dist

    def refuse(*a, **k):
        raise AssertionError("rank gloo đã chạm vào CUDA (torch.cuda.current_stream)")

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_stream", refuse)
        out = fsdp_in_full.save_checkpoint(0, 1, str(tmp_path / "ckpt"))
    finally:
        dist.destroy_process_group()
    assert out["files"] == [".metadata", "__0_0.distcp"]
