"""Section 4.1.2 (DataParallel): the GIL measurement, DP on the CPU, the emulated DP step, the
memory floor, and the DP-against-DDP measurement (gloo on CPU, CUDA where there are GPUs)."""

import inspect
import os
import time

import pytest
import torch

from dpbook import gil
from dpbook.pages import dataparallel
from dpbook import launch, models

TINY = {"in_dim": 16, "hidden": 32, "depth": 2, "out_dim": 4}
GPUS = dataparallel.cuda_devices()


# ------------------------------------------------------------------ the GIL

def test_spin_is_deterministic_pure_python_work():
    assert gil.spin(10) == sum(i * i % 7 for i in range(10))


def test_spin_cpu_reports_this_process_s_cpu_time_of_the_spin():
    c0, w0 = time.process_time(), time.perf_counter()
    cpu = gil.spin_cpu(300_000)
    c1, w1 = time.process_time(), time.perf_counter()
    # the spin's CPU seconds lie within those the process spent around the call, and one thread
    # cannot burn more CPU seconds than wall seconds passed
    assert 0 < cpu <= c1 - c0 and cpu <= w1 - w0


@pytest.mark.parametrize("kwargs", [{"workers": 0}, {"work": 0}, {"rounds": True},
                                    {"workers": 1.5}])
def test_gil_speedup_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        gil.gil_speedup(**kwargs)


def test_threads_never_keep_more_than_one_core_busy():
    r = gil.gil_speedup(2, work=300_000, rounds=5)
    assert (r.workers, r.rounds) == (2, 5) and r.cores == gil.available_cores()
    # the GIL: however busy or idle the machine, two threads of Python burn at most one core
    assert 0 < r.threads_cores < 1.15
    assert r.threads_speedup == pytest.approx(r.serial_s / r.threads_s)
    assert r.processes_speedup == pytest.approx(r.serial_s / r.processes_s)
    text = r.describe()
    assert "2 luồng" in text and "2 process" in text and "tuần tự" in text
    if r.spare_cores is not None:
        # the serial runs kept one core busy, so at most the other cores sat idle; /proc/stat's
        # idle counter ticks at CLK_TCK per core, read twice a round
        ticks = 2 * os.cpu_count() / os.sysconf("SC_CLK_TCK") / r.serial_s
        assert 0 <= r.spare_cores <= os.cpu_count() - 1 + ticks
    assert 0 <= r.quiet_rounds <= r.rounds and (r.quiet_speedup is None) == (r.quiet_rounds == 0)
    # processes' speed-up is not asserted: a round /proc/stat calls quiet still gave 1,1x on a
    # machine shared with make test's other worker (4.1.2 prints it instead)


def test_a_round_is_quiet_only_when_other_programs_left_the_cores():
    # 2 cores, 1 s: this job used 1 CPU s and the machine idled 0.9 s, so others took 0.1 core
    assert gil._others(2, 1.0, 1.0, 10.0, 10.9) == pytest.approx(0.1)
    assert gil._others(2, 1.0, 1.0, 10.0, 10.0) == pytest.approx(1.0)  # the other core was busy
    assert gil._others(2, 1.0, 1.0, None, 10.0) is None


# ------------------------------------------------------------------ DP on this machine

@pytest.mark.skipif(GPUS > 0, reason="without CUDA only")
def test_dataparallel_without_gpus_just_calls_the_module():
    model = models.build_mlp(**TINY)
    info = dataparallel.dataparallel_info(model, torch.randn(8, TINY["in_dim"]))
    assert info.device_ids == () and info.same_module and info.max_abs_diff == 0.0
    assert info.param_device == info.output_device == "cpu"
    assert "device_ids = []" in info.describe()


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
def test_dataparallel_with_gpus_uses_them_all():
    info = dataparallel.dataparallel_info(models.build_mlp(**TINY), torch.randn(8, TINY["in_dim"]))
    assert info.device_ids == tuple(range(GPUS)) and info.output_device == "cuda:0"
    assert info.max_abs_diff < 1e-4


def test_why_no_dataparallel():
    assert "không có GPU" in dataparallel.why_no_dataparallel(0)
    assert "1 GPU" in dataparallel.why_no_dataparallel(1)
    assert dataparallel.why_no_dataparallel(2) == ""


def test_backward_of_dp_functions_read_from_pytorch():
    assert dataparallel.backward_of() == {"Scatter": "Gather", "Broadcast": "ReduceAddCoalesced",
                                "Gather": "Scatter"}


def test_dataparallel_forward_scatters_before_it_replicates():
    source = inspect.getsource(torch.nn.DataParallel.forward)
    assert source.index("self.scatter(") < source.index("self.replicate(") \
        < source.index("self.parallel_apply(") < source.index("self.gather(")


# ------------------------------------------------------------------ the emulated DP step

@pytest.mark.parametrize("batch,replicas,sizes", [(8, 2, (4, 4)), (10, 4, (3, 3, 3, 1)),
                                                   (5, 4, (2, 2, 1)), (3, 1, (3,))])
def test_emulated_step_sums_replica_gradients_into_the_full_batch_gradient(batch, replicas,
                                                                           sizes):
    model = models.build_mlp(**TINY).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, TINY["in_dim"], generator=g, dtype=torch.float64)
    y = torch.randn(batch, TINY["out_dim"], generator=g, dtype=torch.float64)
    step = dataparallel.emulate_dp_step(model, x, y, replicas)
    assert step.chunk_sizes == sizes and step.output_rows == batch
    assert len(set(step.threads)) == len(sizes)  # one thread per replica
    assert step.reduce_diff < 1e-12 and step.full_batch_diff < 1e-12
    assert step.loss == pytest.approx(torch.nn.functional.mse_loss(model(x), y).item())
    assert all(p.grad is not None for p in model.parameters())


def test_emulated_step_rejects_zero_replicas():
    with pytest.raises(ValueError):
        dataparallel.emulate_dp_step(models.build_mlp(**TINY), torch.zeros(2, 16), torch.zeros(2, 4), 0)


# ------------------------------------------------------------------ memory and measurement

def test_dp_memory_floor():
    resnet50 = 25_557_032
    assert dataparallel.dp_memory_floor(resnet50) == {"gpu0": 16 * resnet50,
                                                      "gpu0_reduce": 20 * resnet50,
                                                      "other": 8 * resnet50}
    assert dataparallel.dp_memory_floor(10, "mixed") == {"gpu0": 160, "gpu0_reduce": 180,
                                                         "other": 40}
    assert dataparallel.dp_memory_floor(10, optimizer="sgd") == {"gpu0": 80, "gpu0_reduce": 120,
                                                                 "other": 80}
    with pytest.raises(ValueError):
        dataparallel.dp_memory_floor(0)


def test_dp_largest_model_fills_gpu0_of_the_card():
    from dpbook import memory

    h100 = memory.card("H100 80GB")
    p = dataparallel.dp_largest_model(h100)
    assert p == dataparallel.dp_largest_model("H100 80GB") == h100.usable_bytes // 20
    assert dataparallel.dp_memory_floor(p)["gpu0_reduce"] <= h100.usable_bytes
    assert dataparallel.dp_memory_floor(p + 1)["gpu0_reduce"] > h100.usable_bytes
    assert dataparallel.dp_largest_model(h100, "fp32", "sgd") == h100.usable_bytes // 12
    # DDP holds the same 20P by default (its bucket copy of the gradients): the same limit
    assert p == h100.usable_bytes // memory.vram_ledger(1, 1, "DDP").total
    with pytest.raises(ValueError, match="card"):
        dataparallel.dp_largest_model("H100")


def test_gpu_model_size():
    assert models.num_params(models.build_mlp(**dataparallel.GPU_MODEL)) == 33_571_840


@pytest.mark.skipif(GPUS > 0, reason="without CUDA only")
def test_measurements_explain_why_they_cannot_run_on_cpu():
    with pytest.raises(RuntimeError, match="DataParallel cần ít nhất 2 GPU"):
        dataparallel.measure_dataparallel(TINY)
    with pytest.raises(RuntimeError, match="không có GPU"):
        dataparallel.compare_dp_ddp()


def test_ddp_worker_checks_the_batch_split():
    with pytest.raises(ValueError, match="chia hết"):
        dataparallel.ddp_step_worker(0, 3, TINY, global_batch=16)


@pytest.mark.distributed
def test_ddp_step_worker_runs_on_every_rank():
    ranks = launch.spawn(dataparallel.ddp_step_worker, world_size=2, model_kwargs=TINY, global_batch=16,
                         steps=2, warmup=1, output="none")
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["num_params"] for r in ranks} == {models.num_params(models.build_mlp(**TINY))}
    assert all(r["step_s"] > 0 and len(r["step_times"]) == 2 for r in ranks)
    assert all(r["peak_bytes"] > 0 for r in ranks)


@pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")
def test_measure_dataparallel_on_one_gpu():
    r = dataparallel.measure_dataparallel(TINY, global_batch=16, steps=2, warmup=1, device_ids=[0])
    assert r["world_size"] == 1 and len(r["peak_bytes"]) == 1 and r["peak_bytes"][0] > 0
    assert r["step_s"] > 0


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
def test_compare_dp_ddp_on_two_gpus():
    r = dataparallel.compare_dp_ddp(2, global_batch=64, steps=3, warmup=1)
    peaks = r["dp"]["peak_bytes"]
    assert peaks[0] > peaks[1]  # GPU 0 carries the optimizer state and the whole output
    assert max(r["ddp_peak_bytes"]) < 1.05 * min(r["ddp_peak_bytes"])  # DDP is balanced


def test_available_cores_is_within_the_machine():
    assert 1 <= gil.available_cores() <= (__import__("os").cpu_count() or 1)
    limit = gil._cgroup_cpu_limit()
    assert limit is None or limit > 0


# ------------------------------------------------------------------ how DP moves data

def test_dp_moves_data_as_the_page_says_in_torchs_source():
    rows = dataparallel.comm_source_lines()
    assert len(rows) == len(dataparallel.COMM_LINES) and all(found for *_, found in rows)
    files = {file for file, *_ in rows}
    assert files == {"torch/nn/parallel/scatter_gather.py", "torch/nn/parallel/_functions.py",
                     "torch/nn/parallel/comm.py", "torch/nn/parallel/replicate.py"}
    # a line that is not there is reported as missing, not hidden
    fake = (("torch.nn.parallel.comm", "reduce_add", "nccl.all_reduce(inputs)"),)
    assert dataparallel.comm_source_lines(fake)[0][3] is False
    import torch.cuda.comm
    from torch.nn.parallel import comm
    assert torch.cuda.comm.reduce_add is comm.reduce_add


def test_weaknesses_are_one_list_of_six():
    assert len(dataparallel.WEAKNESSES) == len(set(dataparallel.WEAKNESSES)) == 6
    assert "GIL" in dataparallel.WEAKNESSES[0] and "mọi bước" in dataparallel.WEAKNESSES[1]


def test_traffic_and_rooted_reports_are_vietnamese_numbers():
    text = dataparallel.traffic_report((4, 8))
    assert text.splitlines()[0] == ("N = 4: DP, GPU 0 272 MB; DP, GPU bận nhất 419 MB; DDP, mỗi "
                                    "GPU 316 MB; DP không có NCCL, GPU 0 681 MB")
    assert "1,5 GB" in text.splitlines()[1]
    report = dataparallel.rooted_report("broadcast", 4e9, 4).splitlines()
    assert report[0] == "Broadcast 4 GB, N = 4"
    assert report[2].split() == ["GPU", "0", "gửi", "4", "GB,", "nhận", "0", "B", "gửi", "12", "GB,",
                                 "nhận", "0", "B"]
    with pytest.raises(ValueError, match="collective"):
        dataparallel.rooted_report("all_reduce", 1.0, 2)
