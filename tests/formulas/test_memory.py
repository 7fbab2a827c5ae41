"""The VRAM ledger against the ZeRO paper's numbers."""

import pytest

from dpbook import memory

P = 7_500_000_000  # the ZeRO paper's running example: a 7.5B-parameter model, 64 GPUs


def test_zero_paper_figure_1():
    # 16 bytes per parameter: 120 GB for DDP; ZeRO-1/2/3 on 64 GPUs: 31.4, 16.6, 1.9 GB
    kw = dict(precision="mixed", world_size=64)
    assert memory.vram_ledger(P, strategy="DDP", **kw).state == 16 * P == 120e9
    assert memory.vram_ledger(P, strategy="ZeRO-1", **kw).state / 1e9 == pytest.approx(31.4, abs=0.05)
    assert memory.vram_ledger(P, strategy="ZeRO-2", **kw).state / 1e9 == pytest.approx(16.6, abs=0.05)
    assert memory.vram_ledger(P, strategy="ZeRO-3", **kw).state / 1e9 == pytest.approx(1.9, abs=0.05)


def test_bytes_per_parameter_conventions():
    assert sum(memory.bytes_per_param("fp32", "adam")) == 16
    assert memory.bytes_per_param("mixed", "adam") == (2, 2, 12)
    assert sum(memory.bytes_per_param("mixed_fp32_grads", "adam")) == 18
    assert sum(memory.bytes_per_param("fp32", "sgd")) == 8


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_sharding_divides_by_world_size(n):
    full = memory.vram_ledger(1000, n, "DDP")
    for s in ("FULL_SHARD", "SHARD_GRAD_OP", "ZeRO-3"):
        assert memory.vram_ledger(1000, n, s).state == pytest.approx(full.state / n)
    # FSDP's NO_SHARD keeps DDP's state but not its bucket copy of the gradients
    no_shard = memory.vram_ledger(1000, n, "NO_SHARD")
    assert no_shard.state == full.state and no_shard.buffers == 0
    assert full.buffers == full.grads == memory.vram_ledger(1000, n, "DDP", bucket_view=True).grads
    assert memory.vram_ledger(1000, n, "DDP", bucket_view=True).buffers == 0


def test_shard_grad_op_holds_full_parameters_during_the_step():
    rest = memory.vram_ledger(1000, 4, "SHARD_GRAD_OP", phase="rest")
    step = memory.vram_ledger(1000, 4, "SHARD_GRAD_OP", phase="step")
    assert rest.params == 1000 and step.params == 4000 and step.grads == rest.grads == 1000
    full = memory.vram_ledger(1000, 4, "FULL_SHARD", phase="step", largest_unit_params=200)
    assert full.params == 1000 + 200 * 4 * 3 / 4


def test_hybrid_shards_within_the_group_only():
    led = memory.vram_ledger(1000, 16, "HYBRID_SHARD", shard_size=8)
    assert led.state == 16 * 1000 / 8


def test_activations_are_a_separate_term():
    led = memory.vram_ledger(1000, 1, activation_bytes=500)
    # DDP's total: the state, its bucket copy of the gradients (4 B each) and the activations
    assert led.state == 16000 and led.buffers == 4000 and led.total == 20500
    assert memory.vram_ledger(1000, 1, activation_bytes=500, bucket_view=True).total == 16500
    with pytest.raises(ValueError, match="bucket_view"):
        memory.vram_ledger(1000, 1, bucket_view="yes")


@pytest.mark.parametrize("kwargs", [
    dict(num_params=0), dict(num_params=10.5), dict(world_size=0), dict(strategy="ZeRO-4"),
    dict(precision="fp8"), dict(optimizer="lion"), dict(phase="peak"),
    dict(strategy="HYBRID_SHARD", world_size=8), dict(strategy="HYBRID_SHARD", world_size=8, shard_size=3),
    dict(activation_bytes=-1), dict(largest_unit_params=10**9),
])
def test_bad_inputs_raise_clear_errors(kwargs):
    args = dict(num_params=1000) | kwargs
    with pytest.raises(ValueError, match="không hợp lệ|phải|cần"):
        memory.vram_ledger(**args)


def test_full_shard_step_adds_the_root_unit_and_the_layer():
    rest = memory.vram_ledger(1000, 4, "FULL_SHARD", phase="rest", largest_unit_params=200,
                              root_unit_params=100)
    step = memory.vram_ledger(1000, 4, "FULL_SHARD", phase="step", largest_unit_params=200,
                              root_unit_params=100)
    assert rest.params == 1000  # at rest nothing is gathered
    assert step.params == 1000 + (200 + 100) * 4 * 3 / 4
    # SHARD_GRAD_OP holds every parameter anyway: the root changes nothing
    sgo = memory.vram_ledger(1000, 4, "SHARD_GRAD_OP", phase="step", root_unit_params=100)
    assert sgo.params == 4000


def test_zero1_shards_only_the_optimizer_state():
    led = memory.vram_ledger(10**9, 8, "ZeRO-1", precision="mixed")
    assert (led.params, led.grads, led.optimizer) == (2e9, 2e9, 12e9 / 8)
    # the same at rest and in the step: no parameter is gathered
    assert memory.vram_ledger(10**9, 8, "ZeRO-1", precision="mixed", phase="step",
                              largest_unit_params=10, root_unit_params=10) == led


def test_zero_redundancy_optimizer_as_pytorch_runs_it():
    # fp32 parameters and gradients, whole on every rank; only the wrapped optimizer's state / N
    led = memory.zero_redundancy_ledger(10**9, 8, activation_bytes=5)
    assert (led.params, led.grads, led.optimizer, led.activations) == (4e9, 4e9, 8e9 / 8, 5)
    # and DDP's bucket copy of the gradients, unless gradient_as_bucket_view=True
    assert led.buffers == led.grads and led.total == 8e9 + 1e9 + 4e9 + 5 and led.host == 0
    assert memory.zero_redundancy_ledger(10**9, 8, bucket_view=True).buffers == 0
    assert memory.zero_redundancy_bytes("adam") == (4, 4, 8) == memory.zero_redundancy_bytes("adamw")
    assert memory.zero_redundancy_bytes("sgd_momentum") == (4, 4, 4)
    assert memory.zero_redundancy_bytes("sgd") == (4, 4, 0)
    assert memory.zero_redundancy_ledger(10**9, 8, optimizer="sgd").optimizer == 0
    # fp32: the paper's "ZeRO-1" row, which 4.2.7 (I) measures to the byte; mixed: 4P - 4P/N more
    # than the paper's 2 + 2 + 12/N, since PyTorch has no bf16 copy and no fp32 master copy
    for p, n in ((16_640, 2), (10**9, 8), (7, 3)):
        assert memory.zero_redundancy_ledger(p, n, bucket_view=True) == memory.vram_ledger(p, n, "ZeRO-1")
        paper = memory.vram_ledger(p, n, "ZeRO-1", precision="mixed")
        assert memory.zero_redundancy_ledger(p, n, bucket_view=True).total - paper.total == \
            pytest.approx(4 * p - 4 * p / n)
    # one rank: nothing divided, DDP's fp32 state
    assert memory.zero_redundancy_ledger(1000, 1) == memory.vram_ledger(1000, 1, "DDP")
    # the paper's ZeRO-1 row is unchanged (section 4.1.7 teaches it)
    assert memory.bytes_per_param("mixed", "adam") == (2, 2, 12)
    for kwargs, match in ((dict(num_params=0), "num_params"), (dict(world_size=0), "world_size"),
                          (dict(optimizer="lion"), "optimizer"),
                          (dict(activation_bytes=-1), "activation_bytes")):
        with pytest.raises(ValueError, match=match):
            memory.zero_redundancy_ledger(**({"num_params": 10, "world_size": 2} | kwargs))


@pytest.mark.parametrize("kwargs", [
    dict(root_unit_params=-1), dict(largest_unit_params=600, root_unit_params=600),
    dict(root_unit_params=1.5),
])
def test_gathered_units_are_checked(kwargs):
    with pytest.raises(ValueError, match="root_unit_params"):
        memory.vram_ledger(1000, 2, "FULL_SHARD", **kwargs)


def test_a_card_is_its_gib_less_the_drivers_share_and_the_cuda_context():
    h100 = memory.card("H100 80GB")
    assert h100.capacity_bytes == 80 * 2**30 == 85_899_345_920  # "80 GB" on the label is 80 GiB
    assert h100.total_bytes == round(79.11 * 2**30)  # PyTorch's OOM message on an H100: 79.11 GiB
    assert round(h100.total_bytes / 2**30, 2) == 79.11
    assert h100.driver_reserved_bytes == h100.capacity_bytes - h100.total_bytes > 0
    assert h100.context_bytes == memory.CUDA_CONTEXT_BYTES == 287_047_680  # PyTorch PR #86509
    assert h100.usable_bytes == round(79.11 * 2**30) - 287_047_680
    assert round(h100.usable_bytes / 80e9 - 1, 2) == 0.06  # what "80 GB = 80e9 B" understates


def test_the_cards_are_sorted_and_sourced():
    cards = memory.CARDS
    assert [c.name for c in cards] == ["RTX 4090", "A100 40GB", "H100 80GB", "H200"]
    assert [c.marketed_gb for c in cards] == [24, 40, 80, 141]
    assert [c.usable_bytes for c in cards] == sorted(c.usable_bytes for c in cards)
    assert all(c.context_bytes < c.total_bytes <= c.capacity_bytes and c.source for c in cards)
    assert "ước lượng" in memory.card("H200").source  # not a measurement: said so
    assert round(memory.card("A100 40GB").total_bytes / 2**30, 2) == 39.5


def test_fits_compares_with_what_pytorch_can_allocate():
    gpu = memory.card("A100 40GB")
    assert memory.fits(gpu.usable_bytes, gpu) and not memory.fits(gpu.usable_bytes + 1, gpu)
    assert not memory.fits(40 * 2**30, gpu)  # the whole 40 GiB is not for PyTorch
    assert memory.fits(40e9, gpu)


@pytest.mark.parametrize("kwargs, match", [
    ({"marketed_gb": 0}, "marketed_gb"),
    ({"total_bytes": 81 * 2**30}, "total_bytes"),
    ({"context_bytes": 90 * 2**30}, "context_bytes"),
    ({"total_bytes": 1.5}, "total_bytes"),
])
def test_bad_cards_are_refused_in_vietnamese(kwargs, match):
    args = {"name": "x", "marketed_gb": 80, "total_bytes": 85 * 10**9, "source": "thử"} | kwargs
    with pytest.raises(ValueError, match=match) as err:
        memory.Card(**args)
    assert any(w in str(err.value) for w in ("phải", "cần"))


def test_card_lookup_and_fits_reject_what_is_not_a_card():
    with pytest.raises(ValueError, match="card"):
        memory.card("H100")
    with pytest.raises(ValueError, match="memory.Card"):
        memory.fits(1, 80)
    with pytest.raises(ValueError, match="nbytes"):
        memory.fits(-1, memory.card("H200"))


def test_cpu_offload_moves_the_sharded_state_to_the_host():
    kw = dict(precision="mixed", phase="step", largest_unit_params=200, root_unit_params=100)
    for strategy in ("FULL_SHARD", "ZeRO-3"):
        plain = memory.vram_ledger(1000, 4, strategy, **kw)
        off = memory.vram_ledger(1000, 4, strategy, offload=True, **kw)
        assert off.host == plain.state - (200 + 100) * 2 * 3 / 4 == 16 * 1000 / 4
        assert (off.params, off.grads, off.optimizer) == ((200 + 100) * 2, 0, 0)  # gathered units
    sgo = memory.vram_ledger(1000, 4, "SHARD_GRAD_OP", offload=True, **kw)
    assert sgo.params == 2 * 1000 and sgo.host == 4000  # every parameter stays gathered
    hybrid = memory.vram_ledger(1000, 8, "HYBRID_SHARD", shard_size=2, offload=True, **kw)
    assert hybrid.host == 16 * 1000 / 2 and hybrid.params == 600
    rest = memory.vram_ledger(1000, 4, "FULL_SHARD", offload=True, activation_bytes=7,
                              precision="mixed")
    assert rest.state == 0 and rest.total == 7 and rest.host == 4000  # nothing on the GPU at rest
    assert memory.vram_ledger(1000, 4, "FULL_SHARD").host == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(strategy="DDP", offload=True), "PyTorch không có CPU offload cho DDP"),
    (dict(strategy="ZeRO-1", offload=True), "chỉ dùng được với các chiến lược FSDP"),
    (dict(strategy="FULL_SHARD", offload="yes"), "offload phải là True hoặc False"),
])
def test_offload_is_refused_where_pytorch_has_none(kwargs, match):
    with pytest.raises(ValueError, match=match):
        memory.vram_ledger(1000, 4, **kwargs)


def test_checkpointing_keeps_the_blocks_inputs_and_one_block():
    a = 34 * 10**9  # 10 blocks of 3.4 GB, each keeping its input: 2/34 of it
    assert memory.CHECKPOINT_KEPT_FRACTION == 2 / 34
    got = memory.checkpointed_activation_bytes(a, 10)
    assert got == pytest.approx(10 * 2 / 34 * a / 10 + a / 10) and got == a * (2 / 34 + 1 / 10)
    assert memory.checkpointed_activation_bytes(a, 1) > a  # one block: nothing to gain
    assert memory.checkpointed_activation_bytes(a, 4, kept_fraction=0.25) == a * 0.5
    for kwargs, match in ((dict(activation_bytes=-1, num_blocks=2), "activation_bytes"),
                          (dict(activation_bytes=1, num_blocks=0), "num_blocks"),
                          (dict(activation_bytes=1, num_blocks=2, kept_fraction=0), "kept_fraction")):
        with pytest.raises(ValueError, match=match):
            memory.checkpointed_activation_bytes(**kwargs)
