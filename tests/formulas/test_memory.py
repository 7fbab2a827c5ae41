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
    assert memory.vram_ledger(1000, n, "NO_SHARD") == full


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
    assert led.state == 16000 and led.total == 16500


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


@pytest.mark.parametrize("kwargs", [
    dict(root_unit_params=-1), dict(largest_unit_params=600, root_unit_params=600),
    dict(root_unit_params=1.5),
])
def test_gathered_units_are_checked(kwargs):
    with pytest.raises(ValueError, match="root_unit_params"):
        memory.vram_ledger(1000, 2, "FULL_SHARD", **kwargs)
