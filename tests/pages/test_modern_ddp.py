"""Section 4.2.7's pure logic: PowerSGD's rule, the alpha-beta cost of a hook, ZeRO's split, the
flight recorder's environment and dumps. The page's hidden cells test the real runs."""

import math
import pickle

import pytest
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from dpbook import costs
from dpbook.models import build_mlp
from dpbook.pages import modern_ddp


def test_worth_compressing_is_the_hooks_own_rule():
    for n in (1, 2, 8, 64, 128, 1000):
        for m in (1, 3, 8, 128, 4096):
            for r in (1, 2, 4, 16):
                for rate in (0.5, 1, 2, 3):
                    want = powerSGD_hook._should_compress(n, m, min(n, m, r), rate)[0]
                    assert modern_ddp.worth_compressing(n, m, r, rate) == want, (n, m, r, rate)


def test_the_plan_of_the_pages_model():
    shapes = [tuple(p.shape) for p in build_mlp(**modern_ddp.MODEL).parameters()]
    one, four = (modern_ddp.powersgd_plan(shapes, r) for r in (1, 4))
    assert one.messages == (392, 392, 448) and one.compressed == (0, 2, 4, 6)
    assert four.messages == (1416, 1536, 1280) and four.compressed == (0, 2, 4)  # 8 x 128 too thin
    assert one.total_before == four.total_before == 42_376
    assert one.nbytes() == (1568, 1568, 1792) and four.nbytes(2) == (2832, 3072, 2560)
    assert one.ratio == 42_376 / 1232


def test_a_vector_is_never_compressed_and_a_tensor_is_viewed_as_rows_by_the_rest():
    assert modern_ddp.powersgd_plan([(4096,)], 1).messages == (4096, 0, 0)
    conv = modern_ddp.powersgd_plan([(64, 32, 3, 3)], 2)  # 64 x 288
    assert conv.messages == (0, 64 * 2, 288 * 2) and conv.compressed == (0,)


@pytest.mark.parametrize("shapes, rank, rate, needle", [
    ([], 1, 2, "shapes"), ([(0, 4)], 1, 2, "shapes"), ([(4, 2.5)], 1, 2, "shapes"),
    ([(4, 4)], 0, 2, "rank"), ([(4, 4)], 1, 0, "min_compression_rate"),
    ([(4, 4)], 1, True, "min_compression_rate"),
])
def test_the_plan_refuses_bad_input(shapes, rank, rate, needle):
    with pytest.raises(ValueError, match=needle):
        modern_ddp.powersgd_plan(shapes, rank, rate)


def test_hook_time_pays_a_latency_per_message_even_an_empty_one():
    model = (2, 50e-6, 1e9)
    assert modern_ddp.hook_time((0, 0, 0), *model) == 3 * 2 * 50e-6
    assert modern_ddp.hook_time((1000, 2000), *model) == sum(
        costs.alpha_beta_time("all_reduce", b, *model) for b in (1000, 2000))


def test_at_the_break_even_size_the_hook_and_one_all_reduce_take_as_long():
    for world_size, alpha, beta in ((2, 50e-6, 1e9), (8, 5e-6, 100e9)):
        n_half = world_size * alpha * beta
        for messages, ratio in ((3, 34.4), (3, 512), (2, 4), (1, 2)):
            n = modern_ddp.break_even_bytes(n_half, messages, ratio)
            hooked = modern_ddp.hook_time([n / ratio / messages] * messages, world_size, alpha, beta)
            plain = modern_ddp.hook_time([n], world_size, alpha, beta)
            assert math.isclose(hooked, plain, rel_tol=1e-12, abs_tol=1e-15)
    assert modern_ddp.break_even_bytes(100_000, 1, 2) == 0  # one message: always ahead


@pytest.mark.parametrize("ratio", [1, 0.5, True, "2"])
def test_break_even_needs_a_real_compression(ratio):
    with pytest.raises(ValueError, match="ratio"):
        modern_ddp.break_even_bytes(1e5, 3, ratio)


def test_zero_partition_is_greedy_by_size_with_ties_to_the_lowest_rank():
    assert modern_ddp.zero_partition([4096, 64] * 4, 2) == [[0, 4, 1, 5], [2, 6, 3, 7]]
    numels = [p.numel() for p in build_mlp().parameters()]
    assert modern_ddp.zero_partition(numels, 2) == [[2, 0], [4, 6, 1, 3, 5, 7]]
    assert modern_ddp.zero_partition([5, 5, 5], 4) == [[0], [1], [2], []]
    parts = modern_ddp.zero_partition([7, 3, 9, 1, 4], 3)
    assert sorted(i for p in parts for i in p) == list(range(5))
    with pytest.raises(ValueError, match="numels"):
        modern_ddp.zero_partition([3, 0], 2)
    with pytest.raises(ValueError, match="world_size"):
        modern_ddp.zero_partition([3], 0)


def test_record_all_reduce_sees_every_call_and_puts_the_function_back(monkeypatch):
    import torch

    sent = []
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: sent.append(t.numel()))
    fake = dist.all_reduce
    with modern_ddp.record_all_reduce() as calls:
        dist.all_reduce(torch.ones(3, dtype=torch.float16))
        dist.all_reduce(torch.ones(2))
    assert calls == [(6, "float16", "MainThread"), (8, "float32", "MainThread")] and sent == [3, 2]
    assert dist.all_reduce is fake


def test_hook_configs_add_bf16_only_under_nccl():
    assert modern_ddp.hook_configs("gloo") == modern_ddp.HOOKS
    assert modern_ddp.hook_configs("nccl") == modern_ddp.HOOKS + ("bf16",)


def test_flight_recorder_environment():
    env = modern_ddp.flight_recorder_env("/shared/fr/trace_", buffer_size=500)
    assert env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_NCCL_ENABLE_MONITORING": "1",
                   "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/shared/fr/trace_"}
    with pytest.raises(ValueError, match="prefix"):
        modern_ddp.flight_recorder_env("")
    with pytest.raises(ValueError, match="buffer_size"):
        modern_ddp.flight_recorder_env("/tmp/x_", buffer_size=0)


def _entry(seq, state="completed", name="nccl:all_reduce", group="0"):
    return {"record_id": seq - 1, "pg_id": 0, "process_group": (group, "default_pg"),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": name,
            "time_created_ns": seq, "input_sizes": [[16]], "input_dtypes": ["Float"],
            "output_sizes": [[16]], "output_dtypes": ["Float"], "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": True, "timeout_ms": 1000, "is_p2p": False, "frames": []}


def _dump(entries):
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                   "ranks": "[0, 1]"}},
            "pg_status": {}, "entries": entries}


def test_check_dump_wants_the_collective_that_did_not_complete(tmp_path):
    path = tmp_path / "nccl_trace_rank_0"
    assert "không có file dump" in modern_ddp.check_dump(str(path))
    path.write_bytes(pickle.dumps(_dump([_entry(1), _entry(2)])))
    assert "không có phép all_reduce nào chưa xong" in modern_ddp.check_dump(str(path))
    path.write_bytes(pickle.dumps(_dump([_entry(1), _entry(2), _entry(3, "scheduled")])))
    assert modern_ddp.check_dump(str(path)) is None
    assert modern_ddp.describe_dump(str(path)) == (
        "nccl_trace_rank_0: 3 mục, mục cuối nccl:all_reduce (SeqNum 3, scheduled)")


def test_the_analyzer_names_the_missing_rank_and_its_report_is_returned(tmp_path, capsys):
    dumps = [_dump([_entry(1), _entry(2), _entry(3, "scheduled")]), _dump([_entry(1), _entry(2)])]
    report = modern_ddp.analyse_dumps(dumps, str(tmp_path))
    assert "Not all ranks joining collective, sequence number: 3" in report
    assert "missing ranks: {1}" in report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr_rank_0", "fr_rank_1"]
    assert "missing ranks" not in capsys.readouterr().err  # taken from the logger, not on stderr


def test_register_hook_refuses_an_unknown_configuration():
    with pytest.raises(ValueError, match="name='fp8'"):
        modern_ddp.register_hook("fp8", model=None)
