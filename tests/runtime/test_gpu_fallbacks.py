"""The GPU path, checked on a CPU-only machine: a CUDA build of torch is faked with monkeypatch
(``torch._C._get_accelerator``, ``torch.cuda.is_available`` and friends), and every call that
would open a CUDA context raises, so a rank that runs on the CPU must never make one.

The ranks here are one process (a 1-rank gloo group in the test process itself), because a
monkeypatch does not cross into the processes ``launch.spawn`` starts.
"""

import ast
import math
import pathlib

import pytest
import torch
import torch.distributed as dist

from dpbook import bench, costs, data, launch, measure, train
from dpbook.labs import compare
from dpbook.scripts import ddp_script
from dpbook.pages import fsdp_in_full
from dpbook.models import build_mlp

import book_sources

ROOT = pathlib.Path(__file__).resolve().parents[2]
T4, H100 = (7, 5), (9, 0)  # compute capabilities: no native bf16, native bf16


class TouchedCuda(AssertionError):
    pass


def _refuse(name):
    def call(*args, **kwargs):
        raise TouchedCuda(f"torch.cuda.{name} được gọi trên một rank chạy trên CPU")
    return call


@pytest.fixture
def cuda_build(monkeypatch):
    """``fake(capability)``: this process becomes a CUDA build of torch seeing two GPUs of that
    compute capability; calls that would open a CUDA context raise ``TouchedCuda``."""
    def fake(capability=H100):
        monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        # As the real one: a T4 emulates bf16 (slowly), so only including_emulation=False says no.
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True:
                            capability >= (8, 0) or including_emulation)
        for name in ("synchronize", "empty_cache", "set_device", "current_device", "init",
                     "_lazy_init", "reset_peak_memory_stats"):
            monkeypatch.setattr(torch.cuda, name, _refuse(name))
    return fake


@pytest.fixture
def gloo_rank(tmp_path, monkeypatch):
    """A 1-rank gloo process group in this process, with the variables ``launch.spawn`` sets."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("LOCAL_RANK", "0")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# ------------------------------------------------- 1. FSDP2 on the rank's own device, not CUDA

def test_fsdp2_under_gloo_shards_on_the_cpu_of_a_cuda_build(gloo_rank, cuda_build):
    cuda_build()
    model = train.apply_fsdp2(build_mlp())
    weight = model.blocks[0].linear.weight
    assert weight.device_mesh.device_type == "cpu"
    assert {p.device.type for p in model.parameters()} == {"cpu"} == {launch.device().type}
    x, y = data.synthetic_regression(4).tensors
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert math.isfinite(train.train_step(model, opt, x, y))


def test_meta_init_materialises_shards_on_the_ranks_device(gloo_rank, cuda_build):
    cuda_build()
    r = fsdp_in_full.meta_init(0, 1)
    assert r["all_meta"] and all(r["loaded_equal"].values())


def test_fsdp_lifecycle_trace_runs_on_the_cpu_of_a_cuda_build(gloo_rank, cuda_build):
    from dpbook.tracing import lifecycle

    cuda_build()
    r = lifecycle.record_lifecycle(0, 1)
    assert r["call"] == "apply_fsdp2(model, reshard_after_forward=True)"
    assert {e.kind for e in r["events"]} >= {"forward_compute", "backward_post", "step_end"}


def test_the_ranks_batch_goes_to_the_device_it_is_given():
    x, y = torch.arange(12.0).reshape(6, 2), torch.arange(6.0)
    xs, ys = data.rank_batch((x, y), 1, 2, torch.device("cpu"), start=2)
    assert torch.equal(xs, x[4:6]) and torch.equal(ys, y[4:6])
    assert {t.device.type for t in data.rank_batch((x, y), 0, 3, torch.device("meta"))} == {"meta"}


# Code a reader copies or writes calls fully_shard itself, as plain PyTorch does: the script of
# 4.2.3 and the wrapping exercise's solution and wrong versions. The book's machinery does not.
PLAIN_PYTORCH = {"scripts/train_fsdp.py", "labs/wrap/solution.py", "labs/wrap/mutants.py"}


def _fully_shard_callers() -> set[str]:
    """``module.function`` of every call of ``fully_shard`` in the package's machinery."""
    found = set()
    pkg = ROOT / "code" / "dpbook"
    for path in pkg.rglob("*.py"):
        if path.relative_to(pkg).as_posix() in PLAIN_PYTORCH:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fully_shard":
                    found.add(f"{path.stem}.{fn.name}")
    return found


def test_fully_shard_is_called_in_one_place_which_passes_the_mesh():
    assert _fully_shard_callers() == {"train.shard_blocks"}


# ------------------------------------------------------ 2. CPU ranks never open a CUDA context

def test_timing_a_cpu_step_does_not_synchronise_cuda(cuda_build):
    cuda_build()
    calls = []
    times = measure.time_steps(lambda: calls.append(1), repeats=2, warmup=1)
    assert len(times) == 2 and len(calls) == 3


def test_measuring_configurations_on_cpu_does_not_empty_the_cuda_cache(gloo_rank, cuda_build):
    cuda_build()
    wl = compare.Workload({"in_dim": 8, "hidden": 8, "depth": 1, "out_dim": 8}, 4, 1)
    out = compare.measure_configs(0, 1, parallels=(train.Parallel("ddp"),), wl=wl)
    assert out["DDP"]["step_times"] and out["workload"] == wl


# ------------------------------------- 3. section 4.2.1: per-rank benchmark results under NCCL

def _code_cell(notebook: str, marker: str) -> str:
    (source,) = [c.source for c in book_sources.cells(ROOT / notebook, "code")
                 if marker in c.source]
    return source


def _nccl_bench_runs(devices, seconds=(1e-6, 2e-6, 3e-6, 4e-6, 5e-6)):
    """Per-rank results shaped as an NCCL run returns them, one device per rank."""
    n, base = len(devices), (1e3, 1e5, 1e7, 1e8, 1e9)
    sizes = bench.round_sizes(base, n)
    rows = {name: [bench.BenchRow(s, t, n, name) for s, t in zip(sizes, seconds)]
            for name in ("all_reduce", "all_gather", "reduce_scatter")}
    copy = bench.CopyRow(max(sizes), 1e-3, "cuda:0")  # timed on rank 0, broadcast to all
    runs = [{"backend": "nccl", "device": d, "itemsize": 4, "rows": rows, "copy": copy}
            for d in devices]
    return {"bench_runs": runs, "res": runs[0], "copy": copy, "SIZES": sizes, "base": base,
            "N": n, "MB": 1e6, "mode": launch.Plan("nccl", "cuda", n, n), "math": math,
            "costs": costs}


def test_benchmark_checks_accept_one_gpu_per_rank_and_nothing_else():
    cell = _code_cell("book/ch04/p2/01-giao-tiep.ipynb", "hai biểu đồ trùng nhau")
    exec(cell, _nccl_bench_runs(["cuda:0", "cuda:1"]))  # one GPU per rank: accepted
    # the same checks catch the GPU path's mistakes: both ranks on one GPU, a rank left on the
    # CPU under NCCL, and ranks that disagree on the timings they all should have reduced
    for bad in (_nccl_bench_runs(["cuda:0", "cuda:0"]), _nccl_bench_runs(["cuda:0", "cpu"])):
        with pytest.raises(AssertionError):
            exec(cell, bad)
    ns = _nccl_bench_runs(["cuda:0", "cuda:1"])
    other = _nccl_bench_runs(["cuda:0", "cuda:1"], seconds=(2e-6, 2e-6, 3e-6, 4e-6, 5e-6))
    ns["bench_runs"][1] = other["bench_runs"][1]
    with pytest.raises(AssertionError):
        exec(cell, ns)


# ------------------------------------------------------------- 5. bf16 only where it is native

@pytest.mark.parametrize("capability, dtype", [(T4, torch.float16), (H100, torch.bfloat16)])
def test_mixed_precision_dtype_follows_the_gpu(cuda_build, capability, dtype):
    cuda_build(capability)
    gpu = torch.device("cuda", 0)
    assert ddp_script.autocast(gpu, ddp_script.ScriptConfig()).fast_dtype == dtype
    assert train.amp_dtype(gpu) == dtype
    assert train.grad_scaler(gpu, dtype).is_enabled() == (dtype == torch.float16)


def test_the_ddp_script_reports_its_autocast_dtype():
    # pinned to the CPU (review D7): without a process group the script takes cuda when it can
    cfg = ddp_script.ScriptConfig(epochs=1, num_samples=16, eval_samples=4, progress=False,
                                  device="cpu")
    r = ddp_script.run(0, 1, cfg)
    assert (r["autocast"], r["amp_dtype"]) == (False, None)  # CPU: no autocast


@pytest.mark.parametrize("method, scaler", [
    ("fsdp1", "ShardedGradScaler"), ("fsdp2", "GradScaler")])
def test_fsdp_mixed_precision_on_a_t4_is_fp16_with_a_scaler(cuda_build, method, scaler):
    cuda_build(T4)
    policy, grad_scaler = fsdp_in_full.precision_policy(method, torch.device("cuda", 0))
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.float16, torch.float32)
    assert type(grad_scaler).__name__ == scaler and grad_scaler.is_enabled()


def test_cpu_keeps_bf16_and_needs_no_scaler(cuda_build):
    cuda_build(T4)
    cpu = torch.device("cpu")
    assert train.amp_dtype(cpu) == torch.bfloat16
    policy, scaler = fsdp_in_full.precision_policy("fsdp1", cpu)
    assert policy.param_dtype == policy.buffer_dtype == torch.bfloat16
    assert not scaler.is_enabled()
    assert not train.grad_scaler(cpu, None).is_enabled()
    assert isinstance(ddp_script.autocast(cpu, ddp_script.ScriptConfig()),
                      type(__import__("contextlib").nullcontext()))


# ------------------------------------------------ launch: which errors are consequences

def test_only_communication_errors_are_consequences():
    assert launch._is_secondary(dist.DistBackendError("NCCL error: remote process exited"))
    assert launch._is_secondary(dist.DistNetworkError("Connection reset by peer"))
    assert launch._is_secondary(RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    # A root cause whose text happens to name NCCL stays a root cause.
    assert not launch._is_secondary(ValueError("backend='nccl' cần một GPU cho mỗi rank (NCCL)"))
    assert not launch._is_secondary(RuntimeError(
        "CUDA error: out of memory (hãy đặt NCCL_DEBUG=INFO để xem thêm)"))


# ------------------------------------------------ 4. a crashed rank under NCCL: abort, not destroy

def test_a_failed_nccl_rank_aborts_its_groups_instead_of_destroying_them(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: calls.append("destroy"))
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group",
                        lambda *a: calls.append("abort"))
    for backend, failed in (("nccl", True), ("nccl", False), ("gloo", True), ("gloo", False)):
        launch.leave_groups(backend, failed)
    assert calls == ["abort", "destroy", "destroy", "destroy"]


@pytest.mark.parametrize("backend, destroyed", [("gloo", True), ("nccl", False)])
def test_the_crash_demo_closes_ddps_group_only_under_gloo(gloo_rank, monkeypatch, backend,
                                                          destroyed):
    from dpbook.pages import failures

    groups = []
    real_new_group = dist.new_group

    def new_group(*args, **kwargs):
        groups.append(real_new_group(*args, **kwargs))
        return groups[-1]

    monkeypatch.setattr(dist, "new_group", new_group)
    real_get_backend = dist.get_backend
    monkeypatch.setattr(failures.dist, "get_backend",
                        lambda group=None: backend if group is not None else real_get_backend())
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        failures.crash(0, 1, bad_rank=0, bad_step=1)
    alive = groups[0] in dist.distributed_c10d._world.pg_map
    assert alive != destroyed


# ------------------------------------------------ 8. minor: bound devices, checkpoints, captions

def test_nccl_groups_are_bound_to_the_ranks_gpu():
    assert launch._bound_device("nccl", 3) == {"device_id": torch.device("cuda", 3)}
    assert launch._bound_device("gloo", 3) == {}


def test_the_ddp_checkpoint_is_on_the_cpu_and_keeps_the_loss_scale(tmp_path):
    cfg = ddp_script.ScriptConfig(checkpoint=str(tmp_path / "ckpt.pt"))
    model = build_mlp(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.ones(1))  # the scale exists from the first step on
    scaler.update(new_scale=1024.0)  # as after a few overflows
    live = {"w": torch.ones(2), "nested": [torch.zeros(1), {"t": torch.ones(1)}], "n": 3}
    moved = train.cpu_copy(live)
    assert moved["n"] == 3 and isinstance(moved["nested"], list)
    live["w"].add_(1)  # a copy: later training steps leave the snapshot as it was
    assert torch.equal(moved["w"], torch.ones(2))
    assert all(t.device.type == "cpu" for t in (moved["w"], moved["nested"][0], moved["nested"][1]["t"]))
    ddp_script.save_checkpoint(model, opt, 4, cfg, scaler)
    saved = torch.load(cfg.checkpoint, weights_only=True)
    assert saved["scaler"]["scale"] == 1024.0
    again = torch.amp.GradScaler("cpu")
    assert ddp_script.load_checkpoint(cfg.checkpoint, build_mlp(seed=1), dev="cpu",
                                      scaler=again) == 4
    assert again.get_scale() == 1024.0


def test_the_ledger_caption_names_the_backend_that_ran():
    from dpbook.widgets import ledger

    r = {"num_params": 10, "backend": "nccl",
         "state": measure.StateBytes(params=40, grads=40, optimizer=80)}
    frame = ledger.measured_frame({"DDP": r})
    assert "2 process nccl" in frame.caption and "gloo" not in frame.caption
