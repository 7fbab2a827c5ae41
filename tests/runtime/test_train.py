"""Data parallelism changes where gradients are computed, not what they are: DDP and FSDP on
2 ranks with half batches end with the same weights as one process with the full batch."""

import pytest
import torch

from dpbook import launch, train
from dpbook.models import build_mlp
from dpbook.train import Parallel

pytestmark = pytest.mark.distributed

STEPS, BATCH = 4, 8


@pytest.fixture(scope="module")
def reference():
    # One process, global batch 2 * BATCH: float64 so that the only difference left is the
    # order of floating-point sums, far below the tolerance.
    return train.fit(0, 1, None, steps=STEPS, batch_size=2 * BATCH)


@pytest.mark.parametrize("par", [Parallel("ddp"), Parallel("fsdp2"),
                                 Parallel("fsdp1", strategy="FULL_SHARD"),
                                 Parallel("fsdp1", strategy="SHARD_GRAD_OP")],
                         ids=lambda p: p.label)
def test_two_ranks_match_one_process(reference, par):
    res = launch.spawn(train.fit, par, steps=STEPS, batch_size=BATCH, world_size=2,
                       backend="gloo", output="none")
    for r in res:
        assert r["state"].keys() == reference["state"].keys()
        for name, value in reference["state"].items():
            torch.testing.assert_close(r["state"][name], value, rtol=0, atol=1e-12)
    # The global loss is the mean of the ranks' losses (equal halves of the batch).
    for step in range(STEPS):
        mean = (res[0]["losses"][step] + res[1]["losses"][step]) / 2
        assert mean == pytest.approx(reference["losses"][step], abs=1e-12)
    # ... and training did something: every tensor moved away from its initial value.
    initial = build_mlp().double().state_dict()
    assert all((reference["state"][k] - v).abs().max() > 1e-4 for k, v in initial.items())


def test_fit_refuses_a_world_without_wrapper():
    with pytest.raises(ValueError, match="world_size=1"):
        train.fit(0, 2, None)


# ------------------------------------------ mixed precision: one rule, any NVIDIA GPU (faked)

CAPABILITIES = {"V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "H100": (9, 0)}


@pytest.fixture
def gpu_of(monkeypatch):
    """``gpu_of(capability)``: torch reports a CUDA GPU of that compute capability (and
    ``GradScaler`` then stays enabled, as on a machine with CUDA)."""
    def fake(capability):
        monkeypatch.setattr(torch.version, "hip", None)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        # torch.autocast("cuda", dtype=torch.bfloat16) asks this; a T4 emulates bf16 (slowly)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True: capability >= (8, 0) or including_emulation)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return fake


@pytest.mark.parametrize("gpu", CAPABILITIES)
def test_bf16_only_where_the_gpu_computes_it_natively(gpu_of, gpu):
    gpu_of(CAPABILITIES[gpu])
    native = gpu in ("A100", "H100")
    assert train.native_bf16(CAPABILITIES[gpu]) == native
    p = train.mixed_precision(torch.device("cuda", 0))
    assert p.dtype == (torch.bfloat16 if native else torch.float16)
    assert p.name == ("bfloat16" if native else "float16")
    assert p.loss_scaling == p.scaler().is_enabled() == (not native)  # GradScaler for fp16
    assert type(p.scaler(fsdp1=True)).__name__ == "ShardedGradScaler"
    assert p.autocast().fast_dtype == p.dtype


def test_no_autocast_on_the_cpu_or_when_switched_off(gpu_of):
    gpu_of(CAPABILITIES["T4"])
    for p in (train.mixed_precision(torch.device("cpu")),
              train.mixed_precision(torch.device("cuda", 0), enabled=False)):
        assert p.dtype is None and p.name is None and not p.loss_scaling
        assert not p.scaler().is_enabled()
        with p.autocast():
            assert not torch.is_autocast_enabled("cpu")
    assert train.amp_dtype(torch.device("cpu")) == torch.bfloat16  # FSDP's param_dtype on CPU


def test_every_training_script_takes_its_autocast_from_the_one_rule():
    import ast
    import pathlib

    scripts = pathlib.Path(train.__file__).parent / "scripts"
    for path in scripts.glob("*.py"):
        calls = {ast.unparse(n.func) for n in ast.walk(ast.parse(path.read_text("utf-8")))
                 if isinstance(n, ast.Call)}
        own = calls & {"torch.autocast", "torch.amp.autocast", "GradScaler", "torch.amp.GradScaler",
                       "torch.cuda.is_bf16_supported", "amp_dtype", "grad_scaler"}
        assert not own, f"{path.name} chọn autocast riêng: {own}"
    from dpbook.scripts import ddp_script

    cfg = ddp_script.ScriptConfig(epochs=1, num_samples=16, eval_samples=4, progress=False,
                                  device="cpu")  # pinned: on a GPU machine it would pick cuda
    r = ddp_script.run(0, 1, cfg)  # the CPU: no autocast, no loss scaling
    assert (r["autocast"], r["amp_dtype"], r["loss_scaling"]) == (False, None, False)
