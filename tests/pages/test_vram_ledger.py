"""Section 4.1.7 (the VRAM ledger): ``dpbook.pages.vram_ledger`` against the ZeRO paper and a real
run of DDP, FSDP1 and FSDP2 on 2 ranks."""

import pytest
from dpbook import launch, memory
from dpbook.pages import vram_ledger
from dpbook.measure import PeakMemory, StateBytes

GB = 1e9


def test_zero_stages_reproduce_the_paper():
    z = vram_ledger.zero_stages(7_500_000_000, 64)
    assert list(z) == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    assert [round(led.state / GB, 1) for led in z.values()] == [120.0, 31.4, 16.6, 1.9]


H100_USABLE = round(79.11 * 2**30) - 287_047_680  # the total PyTorch reports on an H100, less the context


@pytest.mark.parametrize("name, n, strategy, expected", [
    ("H100 80GB", 8, "DDP", H100_USABLE // 16), ("H100 80GB", 64, "ZeRO-3", H100_USABLE * 64 // 16),
    ("RTX 4090", 64, "DDP", memory.card("RTX 4090").usable_bytes // 16),
    ("H200", 8, "ZeRO-3", memory.card("H200").usable_bytes * 8 // 16),
])
def test_max_params_is_the_largest_model_that_fits(name, n, strategy, expected):
    gpu = memory.card(name)
    p = vram_ledger.max_params(gpu, n, strategy)
    assert p == expected
    assert memory.fits(memory.vram_ledger(p, n, strategy, precision="mixed").state, gpu)
    assert not memory.fits(memory.vram_ledger(p + 1, n, strategy, precision="mixed").state, gpu)


def test_an_80_gb_card_holds_6_percent_more_than_80e9_bytes_would():
    p = vram_ledger.max_params(memory.card("H100 80GB"), 8, "DDP")
    assert p == 5_291_041_751 and round(p / (80 * GB / 16) - 1, 2) == 0.06


def test_max_params_fits_exactly_for_uneven_division():
    gpu = memory.card("RTX 4090")
    p = vram_ledger.max_params(gpu, 64, "ZeRO-1")  # 4 + 12/64 bytes per parameter
    assert memory.vram_ledger(p, 64, "ZeRO-1", precision="mixed").state <= gpu.usable_bytes
    assert memory.vram_ledger(p + 1, 64, "ZeRO-1", precision="mixed").state > gpu.usable_bytes


def test_cards_table_states_each_step_from_label_to_usable():
    text = vram_ledger.cards_table()
    assert [c.name for c in vram_ledger.CARDS] == ["RTX 4090", "H100 80GB", "H200"]
    line = next(ln for ln in text.splitlines() if ln.startswith("H100 80GB"))
    assert line.split() == ["H100", "80GB", "80", "GB", "80,00", "79,11", "274", "78,84", "84,66"]


@pytest.mark.parametrize("kwargs", [{"gpu": 80}, {"gpu": True}, {"strategy": "ZeRO-4"},
                                    {"precision": "fp8"}, {"world_size": 0}])
def test_max_params_rejects_bad_inputs(kwargs):
    args = {"gpu": memory.card("H100 80GB"), "world_size": 8, "strategy": "DDP"} | kwargs
    with pytest.raises(ValueError, match="phải|không hợp lệ"):
        vram_ledger.max_params(**args)


def _fake(p, n, shard):
    d = 1 if not shard else n
    return {"num_params": p, "state": StateBytes(4 * p // d, 4 * p // d, 8 * p // d),
            "peak": PeakMemory(20 * p, "memtracker")}


def test_compare_rows_and_table():
    results = {name: _fake(100, 2, par.ledger_strategy not in ("DDP", "NO_SHARD"))
               for name, par in vram_ledger.RUNS}
    rows = vram_ledger.compare_rows(results, 2)
    assert all(r.equal for r in rows) and [r.strategy for r in rows][-1] == "FULL_SHARD"
    results["DDP"] = _fake(100, 2, True)  # a DDP that shards would not match the ledger
    assert not vram_ledger.compare_rows(results, 2)[0].equal
    table = vram_ledger.comparison_table(rows).splitlines()
    assert len(table) == 2 + 2 * len(rows)
    assert "dự đoán" in table[2] and "đo được" in table[3] and table[3].endswith("2000")


def test_stacked_bars_draws_each_kind_and_each_card():
    import matplotlib
    matplotlib.use("Agg")
    z = vram_ledger.zero_stages(7_500_000_000, 64)
    fig = vram_ledger.stacked_bars(z, title="t")
    ax = fig.axes[0]
    assert len(ax.patches) == 3 * 4  # three kinds of state, four bars
    lines = sorted(line.get_ydata()[0] for line in ax.get_lines())
    assert lines == [c.usable_bytes / GB for c in vram_ledger.CARDS]
    assert [round(y, 1) for y in lines] == [25.1, 84.7, 149.4]
    assert "H100 80GB: 84,7 GB dùng được" in [t.get_text() for t in ax.texts]
    assert "10⁹" in ax.get_ylabel()
    heights = sum(p.get_height() for p in ax.patches)
    assert heights == pytest.approx(sum(led.state for led in z.values()) / GB)


@pytest.mark.distributed
def test_measured_state_equals_the_ledger_on_two_ranks():
    results = launch.spawn(vram_ledger.measure_strategies, world_size=2, backend="gloo",
                           timeout=180, output="none")
    for res in results:
        rows = vram_ledger.compare_rows(res, 2)
        assert [r.name for r in rows] == [name for name, _ in vram_ledger.RUNS]
        assert all(r.equal for r in rows)
        p = res["DDP"]["num_params"]
        assert rows[0].measured.state == 16 * p and rows[-1].measured.state == 8 * p
        # the bucket buffers: a second fp32 copy of the gradients, gone with bucket views
        saved = res["DDP"]["peak"].peak - res["bucket_view_peak"].peak
        assert abs(saved - 4 * p) <= 0.01 * 4 * p


def test_measure_strategies_frees_each_run_before_the_next(monkeypatch):
    """FSDP's wrappers form reference cycles: without a collection between runs, a finished
    run's model is still allocated during the next one, and a GPU peak counts it (review D11).
    The fake runs build such a cycle; the automatic collector is off, so only the function's
    own ``gc.collect()`` can free it."""
    import gc
    import weakref

    from dpbook import measure

    alive = []

    class Cycle:
        def __init__(self):
            self.me = self

    def run(*_):
        assert all(ref() is None for ref in alive), "a previous run's model is still alive"
        alive.append(weakref.ref(Cycle()))
        return {"num_params": 1}

    monkeypatch.setattr(measure, "measure_step", run)
    monkeypatch.setattr(vram_ledger, "ddp_bucket_view_peak", run)
    monkeypatch.setattr(vram_ledger, "gathered_unit", run)
    enabled = gc.isenabled()
    gc.disable()
    try:
        out = vram_ledger.measure_strategies(0, 2)
    finally:
        if enabled:
            gc.enable()
    assert len(alive) == len(vram_ledger.RUNS) + 2 and "gathered" in out


@pytest.mark.distributed
def test_fsdp2_allocates_the_whole_unit_beside_its_shard():
    """While a unit computes its forward, an FSDP2 rank holds its shard, the full unsharded
    parameters and the AllGather's full output buffer: the shard is not part of the gathered
    unit (review 4.1.5-4.1.8, W1)."""
    for n in (2, 4):
        results = launch.spawn(vram_ledger.gathered_unit, world_size=n, backend="gloo",
                               timeout=180, output="none")
        for r in results:
            assert not r["shard_inside"]
            assert r["unsharded"] == r["buffer"] == r["unit"] == n * r["shard"]
