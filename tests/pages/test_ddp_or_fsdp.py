"""Section 4.1.8 (choosing DDP or FSDP): ``dpbook.pages.ddp_or_fsdp``."""

from dataclasses import replace

import pytest
from dpbook.pages import ddp_or_fsdp
from dpbook import costs, launch, memory, shapes

GB = 1e9
H100, A100 = memory.card("H100 80GB"), memory.card("A100 40GB")


def _card(usable_gb):
    """A made-up card on which PyTorch can allocate exactly ``usable_gb`` GB."""
    return memory.Card(f"thử {usable_gb}", 200, round(usable_gb * GB) + memory.CUDA_CONTEXT_BYTES,
                       "thẻ giả định cho kiểm thử")


def _llm(key, nodes, gpu=H100, act=20.0):
    p = shapes.presets()[key]
    return ddp_or_fsdp.Job(p.num_params, gpu, 8, nodes, activation_gb=act,
                           largest_unit_params=p.largest_unit, root_unit_params=p.root_unit,
                           name=key)


def test_resnet50_parameter_count_is_torchvisions():
    assert ddp_or_fsdp.resnet50_num_params() == 25_557_032
    # the head is 2048 x classes weights plus classes biases
    assert ddp_or_fsdp.resnet50_num_params(1000) - ddp_or_fsdp.resnet50_num_params(10) == 2049 * 990


def test_small_model_gets_ddp():
    job = ddp_or_fsdp.Job(ddp_or_fsdp.resnet50_num_params(), A100, 8, 1, "fp32", "sgd_momentum", 20)
    rec = ddp_or_fsdp.recommend(job)
    assert rec.choice == "DDP"
    assert set(rec.options) == {"DDP", "ZeRO-1", "SHARD_GRAD_OP", "FULL_SHARD"}
    assert rec.options["DDP"].memory_bytes == 12 * job.num_params + 20 * GB
    assert rec.options["FULL_SHARD"].sent_bytes == 1.5 * rec.options["DDP"].sent_bytes
    assert rec.options["DDP"].internode_bytes == 0


def test_7b_on_one_node_climbs_to_the_first_rung_that_fits():
    rec = ddp_or_fsdp.recommend(_llm("llama-7b", 1))
    # ZeRO-1 as PyTorch runs it, 8P + 8P/8 + 20 GB = 80.6 GB > 76.2 GB: SHARD_GRAD_OP, 45.3 GB
    assert rec.choice == "SHARD_GRAD_OP"
    p = rec.job.num_params
    assert rec.options["DDP"].memory_bytes == 16 * p + 20 * GB and not rec.options["DDP"].fits
    z1 = rec.options["ZeRO-1"]
    assert z1.memory_bytes == 4 * p + 4 * p + 8 * p / 8 + 20 * GB and not z1.fits
    assert round(z1.memory_bytes / GB, 1) == 80.6 and rec.job.gpu.usable_bytes > z1.memory_bytes
    # the paper's stage 1 (the ledger's "ZeRO-1" row) would have fitted: 2P + 2P + 12P/8 + A
    paper = memory.vram_ledger(p, 8, "ZeRO-1", precision="mixed", activation_bytes=20 * GB)
    assert round(paper.total / GB, 1) == 57.1 and paper.total <= rec.job.capacity_bytes
    assert rec.options["SHARD_GRAD_OP"].memory_bytes == 2 * p + 14 * p / 8 + 20 * GB
    led = memory.vram_ledger(p, 8, "FULL_SHARD", precision="mixed", phase="step",
                             largest_unit_params=rec.job.largest_unit_params,
                             root_unit_params=rec.job.root_unit_params)
    assert rec.options["FULL_SHARD"].memory_bytes == led.state + 20 * GB
    assert rec.options["FULL_SHARD"].sent_bytes == 3 * 7 / 8 * 2 * p  # bf16: Psi = 2P
    # ZeroRedundancyOptimizer: DDP's AllReduce of Psi plus an AllGather's worth of fp32 broadcasts
    assert z1.sent_bytes == 2 * 7 / 8 * 2 * p + 7 / 8 * 4 * p == 2 * rec.options["DDP"].sent_bytes
    assert rec.options["SHARD_GRAD_OP"].sent_bytes == rec.options["DDP"].sent_bytes
    assert "ZeRO-1 cần 80,6 GB (thiếu 4,5 GB)" in rec.reason
    assert "SHARD_GRAD_OP trên 8 GPU còn 45,3 GB" in rec.reason
    # with DDP's default gradient_as_bucket_view=False both DDP rungs hold 4P more
    assert ddp_or_fsdp.bucket_copy_bytes(rec.job) == 4 * p


def test_zero1_is_priced_as_pytorch_runs_it_whatever_the_precision():
    p, n = 10**9, 8
    for precision in memory.PRECISIONS:
        for opt, k in (("adam", 8), ("adamw", 8), ("sgd_momentum", 4), ("sgd", 0)):
            job = ddp_or_fsdp.Job(p, H100, n, 1, precision, opt, activation_gb=1)
            z1 = ddp_or_fsdp.price(job, "ZeRO-1")
            assert z1.memory_bytes == 4 * p + 4 * p + k * p / n + GB, (precision, opt)
            psi = job.comm_bytes
            assert z1.sent_bytes == 2 * (n - 1) / n * psi + (n - 1) / n * 4 * p
    # in fp32 the paper's row and PyTorch's agree; in mixed precision they do not
    fp32 = ddp_or_fsdp.Job(p, H100, n, 1, "fp32", "adam")
    assert ddp_or_fsdp.price(fp32, "ZeRO-1").memory_bytes == memory.vram_ledger(p, n, "ZeRO-1").total
    assert ddp_or_fsdp.price(fp32, "ZeRO-1").sent_bytes == 3 * (n - 1) / n * fp32.comm_bytes
    mixed = ddp_or_fsdp.Job(p, H100, n, 1, "mixed", "adam")
    paper = memory.vram_ledger(p, n, "ZeRO-1", precision="mixed")
    assert ddp_or_fsdp.price(mixed, "ZeRO-1").memory_bytes - paper.total == 4 * p - 4 * p / n
    # the DDP rung: the ledger's 2 + 2 + 12 equals autocast's 4 + 4 + 8
    # (with gradient_as_bucket_view=True; PyTorch's default adds the bucket copy, 4P: 20P)
    assert ddp_or_fsdp.price(mixed, "DDP").memory_bytes == 16 * p == (4 + 4 + 8) * p
    assert ddp_or_fsdp.bucket_copy_bytes(mixed) == 4 * p
    # on one GPU the optimizer state is not divided: ZeRO-1 holds what DDP holds
    one = ddp_or_fsdp.Job(p, H100, 1, 1, "mixed", "adam")
    assert ddp_or_fsdp.price(one, "ZeRO-1").memory_bytes == ddp_or_fsdp.price(one, "DDP").memory_bytes
    assert ddp_or_fsdp.price(one, "ZeRO-1").sent_bytes == 0


def test_the_in_node_rungs_are_tried_in_order():
    p = 10**9  # Adam, mixed: DDP 16 GB, ZeRO-1 4 + 4 + 8/8 = 9, SHARD_GRAD_OP 2 + 14/8 = 3.75
    def choice(gpu_gb, **kw):
        return ddp_or_fsdp.recommend(ddp_or_fsdp.Job(p, _card(gpu_gb), 8, 1, headroom=0, **kw))
    assert choice(16).choice == "DDP"
    assert choice(15.999).choice == "ZeRO-1"
    assert choice(9).choice == "ZeRO-1"
    assert choice(8.999).choice == "SHARD_GRAD_OP"  # the paper's 5.5 GB would still be ZeRO-1
    assert choice(5).choice == "SHARD_GRAD_OP"
    assert choice(3).choice == "FULL_SHARD"  # 2 GB
    # no layer unit given: the blocks are unknown, so no checkpointing tier; offload comes next
    rec = choice(3, activation_gb=2)  # 2 GB of state + 2 GB of activations
    assert (rec.choice, rec.checkpointing, rec.offload) == ("FULL_SHARD", False, True)
    assert rec.chosen.memory_bytes == 2 * GB and rec.chosen.host_bytes == 16 * GB
    assert "FULL_SHARD cần 4,0 GB (thiếu 1,0 GB)" in rec.reason
    rec = choice(3, activation_gb=2, allow_offload=False)
    assert rec.choice is None and rec.label == "không phương án nào vừa"
    assert "chưa thử activation checkpointing (cần largest_unit_params để biết số khối), CPU " \
           "offload (không được phép)" in rec.reason


def _rungs(rec):
    return [(o.strategy, o.checkpointing, o.offload) for o in rec.ladder]


def test_the_ladder_lists_every_rung_in_order():
    one = ddp_or_fsdp.recommend(ddp_or_fsdp.Job(10**9, _card(1), 8, 1, activation_gb=1,
                                                largest_unit_params=10**8, headroom=0))
    base = ["DDP", "ZeRO-1", "SHARD_GRAD_OP", "FULL_SHARD"]
    assert _rungs(one) == ([(s, False, False) for s in base] + [(s, True, False) for s in base]
                           + [(s, False, True) for s in base[2:]] + [(s, True, True) for s in base[2:]])
    many = ddp_or_fsdp.recommend(ddp_or_fsdp.Job(10**9, _card(1), 8, 2, activation_gb=1,
                                                 largest_unit_params=10**8, headroom=0))
    base = ["DDP", "HYBRID_SHARD", "FULL_SHARD"]
    assert _rungs(many) == ([(s, False, False) for s in base] + [(s, True, False) for s in base]
                            + [(s, False, True) for s in base[1:]] + [(s, True, True) for s in base[1:]])
    assert _rungs(one) == list(ddp_or_fsdp.ladder(one.job))
    assert one.options["DDP"] is one.ladder[0]  # the first tier is the table of options
    no_ckpt = replace(one.job, allow_checkpointing=False)
    assert all(not c for _, c, _ in ddp_or_fsdp.ladder(no_ckpt))
    assert all(not o for _, _, o in ddp_or_fsdp.ladder(replace(one.job, allow_offload=False)))
    assert all(not c for _, c, _ in ddp_or_fsdp.ladder(replace(one.job, activation_gb=0)))


# A family of jobs built so that every rung is smaller than the ones below it: P = 10⁹, Adam in
# mixed precision on 8 GPUs (one node), 10 equal layers of 10⁸ parameters, 20 GB of activations
# (1,18 GB with checkpointing: 20 (1/17 + 1/10)), the headroom at 0 so that the card decides.
FAMILY = dict(num_params=10**9, gpus_per_node=8, nodes=1, activation_gb=20.0,
              largest_unit_params=10**8, headroom=0)
CLIMB = [("DDP", False, False), ("ZeRO-1", False, False), ("SHARD_GRAD_OP", False, False),
         ("FULL_SHARD", False, False), ("DDP", True, False), ("ZeRO-1", True, False),
         ("SHARD_GRAD_OP", True, False), ("FULL_SHARD", True, False),
         ("SHARD_GRAD_OP", True, True), ("FULL_SHARD", True, True)]


def _exact_card(nbytes):
    return memory.Card("thử", 200, nbytes + memory.CUDA_CONTEXT_BYTES, "thẻ giả định cho kiểm thử")


def _family(capacity, **kw):
    return ddp_or_fsdp.recommend(ddp_or_fsdp.Job(gpu=_exact_card(capacity), **(FAMILY | kw)))


def test_every_rung_is_reached_by_a_job_that_needs_it_and_the_boundaries_are_exact():
    import math
    ledger = {r: o.memory_bytes for r, o in zip(_rungs(_family(1)), _family(1).ladder)}
    a, a_ckpt = 20 * GB, memory.checkpointed_activation_bytes(20 * GB, 10)
    assert a_ckpt == 20 * GB * (2 / 34 + 1 / 10)
    assert ledger[("FULL_SHARD", False, False)] == 2 * GB + 2 * 10**8 * 7 / 8 + a
    assert ledger[("ZeRO-1", True, False)] == 8 * GB + 8 * GB / 8 + a_ckpt
    assert ledger[("SHARD_GRAD_OP", True, True)] == 2 * GB + a_ckpt  # every parameter gathered
    assert ledger[("FULL_SHARD", True, True)] == 2 * 10**8 + a_ckpt  # one layer gathered
    needs = [ledger[r] for r in CLIMB]
    assert needs == sorted(needs, reverse=True)  # each rung needs less than the one before
    for i, rung in enumerate(CLIMB):
        fits = _family(math.ceil(needs[i]))  # just fits
        assert (fits.choice, fits.checkpointing, fits.offload) == rung
        short = _family(math.ceil(needs[i]) - 1)  # just does not
        later = (short.choice, short.checkpointing, short.offload)
        assert later == (CLIMB[i + 1] if i + 1 < len(CLIMB) else (None, False, False))
        assert f"{rung[0]} cần" in short.reason and "(thiếu 0,0 GB)" in short.reason
    # without checkpointing, the offload tier alone: SHARD_GRAD_OP, then FULL_SHARD
    alone = {r: o.memory_bytes for r, o in zip(_rungs(_family(1, allow_checkpointing=False)),
                                               _family(1, allow_checkpointing=False).ladder)}
    for rung, nxt in ((("SHARD_GRAD_OP", False, True), ("FULL_SHARD", False, True)),
                      (("FULL_SHARD", False, True), (None, False, False))):
        cap = math.ceil(alone[rung])
        rec = _family(cap, allow_checkpointing=False)
        assert (rec.choice, rec.checkpointing, rec.offload) == rung
        rec = _family(cap - 1, allow_checkpointing=False)
        assert (rec.choice, rec.checkpointing, rec.offload) == nxt


def test_hybrid_and_full_shard_across_nodes_with_every_tier_and_the_host_memory():
    job = dict(FAMILY, nodes=2)
    def rec(capacity, **kw):
        return ddp_or_fsdp.recommend(ddp_or_fsdp.Job(gpu=_exact_card(capacity), **(job | kw)))
    need = {r: o.memory_bytes for r, o in zip(_rungs(rec(1)), rec(1).ladder)}
    a_ckpt = memory.checkpointed_activation_bytes(20 * GB, 10)
    assert need[("HYBRID_SHARD", False, False)] == 16 * GB / 8 + 2 * 10**8 * 7 / 8 + 20 * GB
    assert need[("FULL_SHARD", False, False)] == 16 * GB / 16 + 2 * 10**8 * 15 / 16 + 20 * GB
    for rung in [("HYBRID_SHARD", False, False), ("FULL_SHARD", False, False),
                 ("HYBRID_SHARD", True, False), ("FULL_SHARD", True, False),
                 ("HYBRID_SHARD", True, True)]:
        r = rec(int(need[rung]) + 1)
        assert (r.choice, r.checkpointing, r.offload) == rung
    hsdp = rec(int(need[("HYBRID_SHARD", True, True)]) + 1)
    assert hsdp.chosen.memory_bytes == 2 * 10**8 + a_ckpt
    assert hsdp.chosen.host_bytes == 8 * 16 * GB / 8  # the whole state in each node's memory
    assert hsdp.chosen.pcie_bytes == 4 * 10**9 / 8 * 3  # two gathers and one gradient, fp32
    # the host decides between the two offload rungs: FULL_SHARD puts half as much in each node
    assert rec(int(need[("HYBRID_SHARD", True, True)]) + 1, host_gb=16).choice == "HYBRID_SHARD"
    full = rec(int(need[("HYBRID_SHARD", True, True)]) + 1, host_gb=15.99)
    assert (full.choice, full.checkpointing, full.offload) == ("FULL_SHARD", True, True)
    assert full.chosen.host_bytes == 8 * GB and "bộ nhớ CPU mỗi node 16,0 GB > 16,0 GB" in full.reason
    assert full.chosen.pcie_bytes == 4 * 10**9 / 16 * 3
    assert rec(int(need[("HYBRID_SHARD", True, True)]) + 1, host_gb=7.99).choice is None


def test_the_reason_says_what_failed_by_how_much_and_what_the_chosen_rung_costs():
    rec = ddp_or_fsdp.recommend(_llm("llama-70b", 1))
    assert (rec.choice, rec.checkpointing, rec.offload) == ("FULL_SHARD", False, True)
    for text in ("Mỗi GPU dùng được 76,2 GB", "FULL_SHARD cần 160,4 GB (thiếu 84,2 GB)",
                 "với activation checkpointing (activation 20,0 → 1,4 GB mỗi GPU)",
                 "với CPU offload", "chọn FSDP FULL_SHARD + CPU offload",
                 "mỗi node giữ 1\u202f103,6 GB trạng thái trong bộ nhớ CPU", "103,5 GB qua PCIe"):
        assert text in rec.reason, text
    small = ddp_or_fsdp.recommend(_llm("llama-7b", 1, gpu=memory.card("RTX 4090")))
    assert small.label == "FSDP FULL_SHARD + activation checkpointing"
    assert "tính lại lượt truyền xuôi của 32 khối" in small.reason and small.job.num_blocks == 32


def test_7b_on_four_nodes_gets_hybrid_shard_and_less_internode_traffic():
    rec = ddp_or_fsdp.recommend(_llm("llama-7b", 4))
    assert rec.choice == "HYBRID_SHARD"
    psi = 2 * rec.job.num_params
    hyb, full = rec.options["HYBRID_SHARD"], rec.options["FULL_SHARD"]
    assert hyb.internode_bytes == pytest.approx(2 * 3 / 4 * psi)  # 8 rings of psi/8 over 4 nodes
    assert full.internode_bytes == costs.fsdp_step_bytes(psi, 32).total
    assert hyb.memory_bytes > full.memory_bytes  # it pays in memory: /8 instead of /32


def test_70b_on_four_nodes_needs_full_shard_and_on_one_node_offload():
    rec = ddp_or_fsdp.recommend(_llm("llama-70b", 4))
    assert rec.choice == "FULL_SHARD" and not rec.checkpointing and not rec.offload
    assert not rec.options["HYBRID_SHARD"].fits and rec.options["FULL_SHARD"].fits
    one = ddp_or_fsdp.recommend(_llm("llama-70b", 1))  # was "nothing fits" before the new rungs
    assert one.choice == "FULL_SHARD" and one.offload and not one.checkpointing
    assert not any(o.fits for o in one.ladder[:one.ladder.index(one.chosen)])
    none = ddp_or_fsdp.recommend(replace(_llm("llama-70b", 1), allow_offload=False))
    assert none.choice is None and "thêm GPU" in none.reason and "CPU offload (không được phép)" in none.reason


def test_headroom_and_activations_decide_the_edge():
    p = 10**9  # 16 GB of Adam state
    gpu = _card(20)
    assert ddp_or_fsdp.recommend(ddp_or_fsdp.Job(p, gpu, 8, 1, headroom=0.1)).choice == "DDP"  # 16 <= 18
    assert ddp_or_fsdp.recommend(ddp_or_fsdp.Job(p, gpu, 8, 1, headroom=0.25)).choice == "ZeRO-1"
    assert ddp_or_fsdp.recommend(ddp_or_fsdp.Job(p, gpu, 8, 1, activation_gb=3)).choice == "ZeRO-1"


def test_capacity_is_what_pytorch_can_allocate_on_the_card_less_the_headroom():
    job = _llm("llama-13b", 2, gpu=A100, act=10)
    assert job.capacity_bytes == pytest.approx(0.9 * (A100.total_bytes - memory.CUDA_CONTEXT_BYTES))
    # "40 GB" is 40 GiB: HYBRID_SHARD (37.2 GB) fits in 37.9 GB; it would not in 0.9 x 40e9 = 36e9
    rec = ddp_or_fsdp.recommend(job)
    assert rec.choice == "HYBRID_SHARD"
    assert 36 * GB < rec.options["HYBRID_SHARD"].memory_bytes <= job.capacity_bytes
    assert round(_llm("llama-7b", 1).capacity_bytes / GB, 1) == 76.2
    assert "H100 80GB" in ddp_or_fsdp.decision_html([rec, ddp_or_fsdp.recommend(_llm("llama-7b", 1))])


@pytest.mark.parametrize("kwargs, match", [
    ({"num_params": 0}, "num_params"),
    ({"gpu": 80}, "memory.Card"),
    ({"gpu": "H100 80GB"}, "memory.Card"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"nodes": 1.5}, "nodes"),
    ({"precision": "fp8"}, "precision"),
    ({"optimizer": "lion"}, "optimizer"),
    ({"activation_gb": -2}, "activation_gb"),
    ({"largest_unit_params": 10**10}, "largest_unit_params"),
    ({"root_unit_params": -1}, "root_unit_params"),
    ({"largest_unit_params": 6 * 10**8, "root_unit_params": 6 * 10**8}, "root_unit_params"),
    ({"headroom": 1.0}, "headroom"),
    ({"allow_checkpointing": 1}, "allow_checkpointing phải là True hoặc False"),
    ({"allow_offload": "có"}, "allow_offload phải là True hoặc False"),
    ({"host_gb": -1}, "host_gb"),
])
def test_job_rejects_bad_values_in_vietnamese(kwargs, match):
    base = {"num_params": 10**9, "gpu": H100}
    with pytest.raises(ValueError, match=match) as err:
        ddp_or_fsdp.Job(**(base | kwargs))
    assert any(w in str(err.value) for w in ("phải", "không hợp lệ"))


def test_price_rejects_hybrid_on_one_node_and_unknown_strategies():
    job = ddp_or_fsdp.Job(10**9, H100)
    with pytest.raises(ValueError, match="HYBRID_SHARD cần ít nhất 2 node"):
        ddp_or_fsdp.price(job, "HYBRID_SHARD")
    with pytest.raises(ValueError, match="strategy"):
        ddp_or_fsdp.price(job, "ZeRO-2")
    with pytest.raises(ValueError, match="PyTorch không có CPU offload cho ZeRO-1"):
        ddp_or_fsdp.price(job, "ZeRO-1", offload=True)
    with pytest.raises(ValueError, match="checkpointing=True cần biết số khối"):
        ddp_or_fsdp.price(job, "FULL_SHARD", checkpointing=True)
    with pytest.raises(ValueError, match="checkpointing phải là True hoặc False"):
        ddp_or_fsdp.price(job, "FULL_SHARD", checkpointing="có")
    with pytest.raises(ValueError, match="strategy"):
        ddp_or_fsdp.pcie_bytes(job, "DDP")


def test_tables_list_every_option_and_escape_names():
    recs = [ddp_or_fsdp.recommend(_llm("llama-7b", 4)),
            ddp_or_fsdp.recommend(replace(_llm("llama-70b", 1), allow_offload=False))]
    crit = ddp_or_fsdp.criteria_html(recs[0])
    resnet = ddp_or_fsdp.criteria_html(ddp_or_fsdp.recommend(
        ddp_or_fsdp.Job(25_557_032, A100, precision="fp32", optimizer="sgd_momentum")))
    for text in ("12P/N + gốc và một khối đầy đủ + activation", "8P + 4P/N", "4P + 8P/N"):
        assert text in resnet
    for text in ("16P/S + gốc và một khối đầy đủ + activation", "8P + 8P/N",
                 "2(N−1)/N · Ψ + (N−1)/N · 4P", "gradient_as_bucket_view=True", "ZeroRedundancyOptimizer", "Độ phức tạp mã nguồn", "Quy mô phù hợp", "3(N−1)/N · Ψ", "FSDP HYBRID_SHARD",
                 "Lượng ra khỏi mỗi node"):
        assert text in crit
    table = ddp_or_fsdp.decision_html(recs + [ddp_or_fsdp.recommend(ddp_or_fsdp.Job(10, _card(1), name="<x>"))])
    assert "&lt;x&gt;" in table and "không phương án nào vừa" in table
    assert "1\u202f123,6 ✗" in table  # LLaMA-70B under DDP, Vietnamese decimal comma
    assert "127,8 GB" in recs[0].reason
    assert "FSDP FULL_SHARD + CPU offload" in ddp_or_fsdp.decision_html(
        [ddp_or_fsdp.recommend(_llm("llama-70b", 1))])
    ladder = ddp_or_fsdp.ladder_html(ddp_or_fsdp.recommend(_llm("llama-70b", 1)))
    assert ladder.count("<tr>") == 1 + 12 and "← chọn" in ladder and "1\u202f103,6" in ladder


def test_memory_figure_curves():
    job = _llm("llama-7b", 1)
    fig, ys = ddp_or_fsdp.memory_figure(job, (1, 2, 4))
    assert ys["DDP"] == [ys["DDP"][0]] * 3
    assert ys["FULL_SHARD"][0] == ys["DDP"][0] > ys["FULL_SHARD"][1] > ys["FULL_SHARD"][2]
    import matplotlib.pyplot as plt
    plt.close(fig)


@pytest.mark.distributed
def test_compare_run_matches_the_table():
    results = launch.spawn(ddp_or_fsdp.compare_run, world_size=2, backend="gloo", timeout=180,
                           output="none")
    for r in results:
        ddp, fsdp = r["DDP"], r["FSDP2 reshard_after_forward=True"]
        p = ddp["num_params"]
        job = ddp_or_fsdp.Job(p, H100, 2, 1, "fp32", "adam")
        rec = ddp_or_fsdp.recommend(job)
        assert ddp["volume"].total == rec.options["DDP"].sent_bytes
        assert fsdp["volume"].total == rec.options["FULL_SHARD"].sent_bytes == 1.5 * ddp["volume"].total
        # the DDP rung: gradient_as_bucket_view=True, no bucket copy beside the state measured
        assert ddp["state"].total == rec.options["DDP"].memory_bytes == 16 * p
        assert fsdp["state"].total == rec.options["FULL_SHARD"].memory_bytes == 16 * p / 2
        assert ddp["code"] == {"same_parameters": True, "first_key": "module.blocks.0.linear.weight",
                               "value_type": "Tensor"}
        assert fsdp["code"] == {"same_parameters": False, "first_key": "blocks.0.linear.weight",
                                "value_type": "DTensor"}
        # mixed precision: every setting sends what precision_bytes says
        for name, m in r["precision"].items():
            assert m["volume"] == ddp_or_fsdp.precision_bytes(p, 2, name), name
            # the stored parameters and their gradients stay fp32 (FSDP2 casts the reduced
            # gradient back to the parameter's dtype), whatever param_dtype and reduce_dtype
            assert m["param_dtype"] == m["grad_dtype"] == "float32", name
        # ZeRO-1: one AllReduce of 4P, broadcasts adding up to 4P, Adam state split between ranks
        z1 = r["zero1"]
        assert [x.nbytes for x in z1["records"] if x.collective == "all_reduce"] == [4 * p]
        assert sum(x.nbytes for x in z1["records"] if x.collective == "broadcast") == 4 * p
        assert z1["state"].params == z1["state"].grads == 4 * p and z1["state"].optimizer < 8 * p
        # the rung's price: the measured parameters and gradients, the even share of Adam's state
        zrow = rec.options["ZeRO-1"]
        assert zrow.memory_bytes == z1["state"].params + z1["state"].grads + 8 * p / 2
        assert zrow.sent_bytes == 2 * (2 - 1) / 2 * 4 * p + (2 - 1) / 2 * 4 * p
        # an optimizer built before fully_shard updates nothing and keeps the full originals
        before, after = r["optimizer_order"]["before"], r["optimizer_order"]["after"]
        assert not before["changed"] and before["with_grad"] == 0 and before["optimizer_bytes"] == 4 * p
        assert after["changed"] and after["optimizer_bytes"] == after["shard_bytes"] == 4 * p / 2
    assert sum(r["zero1"]["state"].optimizer for r in results) == 8 * results[0]["DDP"]["num_params"]


def test_precision_settings_in_both_conventions():
    p, n = 1000, 4
    k = (n - 1) / n
    b = {name: ddp_or_fsdp.precision_bytes(p, n, name).total for name, *_ in ddp_or_fsdp.PRECISION_SETTINGS}
    assert b["DDP, fp32"] == b["DDP + autocast bf16"] == 2 * k * 4 * p  # autocast: .grad stays fp32
    assert b["DDP + autocast + hook nén 16 bit"] == 2 * k * 2 * p
    assert b["FSDP2, param bf16, reduce fp32"] == (2 + 2 + 4) * p * k == b["DDP, fp32"]
    assert b["FSDP2, param bf16, reduce bf16"] == 6 * p * k == 1.5 * b["DDP + autocast + hook nén 16 bit"]
    assert b["FSDP2, fp32"] == 1.5 * b["DDP, fp32"]
    with pytest.raises(ValueError, match="setting"):
        ddp_or_fsdp.precision_bytes(p, n, "fp8")


def test_compress_hook_is_bf16_on_a_gpu_and_fp16_on_a_cpu():
    import torch
    assert ddp_or_fsdp.compress_hook(torch.device("cpu")).__name__ == "fp16_compress_hook"
    assert ddp_or_fsdp.compress_hook(torch.device("cuda", 0)).__name__ == "bf16_compress_hook"
