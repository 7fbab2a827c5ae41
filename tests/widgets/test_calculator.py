"""The offline calculators (``dpbook.widgets.calculator``): the JavaScript of the page equals the
Python library, checked in headless Chromium on random inputs and on the inputs Python refuses."""

import json
import random
import shutil

import pytest

from dpbook import costs, decision, memory, vi
from dpbook.shapes import presets
from dpbook.widgets import calculator

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="cần Chromium (gói Debian `chromium`); `make test` tự cài khi chạy với quyền root")
CASES = 1000


# --- the pure part, without a browser

def test_the_data_is_the_librarys():
    d = calculator.data()
    assert [c["usable_bytes"] for c in d["cards"]] == [c.usable_bytes for c in memory.CARDS]
    assert d["presets"]["llama-7b"]["num_params"] == presets()["llama-7b"].num_params
    assert d["memory"]["bytes_per_param"]["mixed"]["adam"] == [2, 2, 12]
    assert d["memory"]["sharded"] == {"DDP": [False] * 3, "NO_SHARD": [False] * 3,
                                      "ZeRO-1": [False, False, True], "ZeRO-2": [False, True, True],
                                      "ZeRO-3": [True] * 3, "FULL_SHARD": [True] * 3,
                                      "SHARD_GRAD_OP": [True] * 3, "HYBRID_SHARD": [True] * 3}
    assert d["decision"]["labels"] == decision.LABELS
    assert d["decision"]["tiers"] == [[False, False], [True, False], [False, True], [True, True]]
    assert d["memory"]["offload_strategies"] == list(memory.OFFLOAD_STRATEGIES)
    assert d["memory"]["zero_redundancy_bytes"] == {"adam": [4, 4, 8], "adamw": [4, 4, 8],
                                                    "sgd": [4, 4, 0], "sgd_momentum": [4, 4, 4]}
    assert d["decision"]["zero_broadcast_bytes"] == decision.ZERO_BROADCAST_BYTES == 4
    assert d["memory"]["kept_fraction"] == memory.CHECKPOINT_KEPT_FRACTION == 2 / 34


def test_the_twins_return_the_library_results():
    p = presets()["llama-7b"]
    led = calculator.model.ledger({"preset": "llama-7b", "world_size": 8, "strategy": "FULL_SHARD",
                                   "precision": "mixed", "phase": "step"})
    ref = memory.vram_ledger(p.num_params, 8, "FULL_SHARD", precision="mixed", phase="step",
                             largest_unit_params=p.largest_unit, root_unit_params=p.root_unit)
    assert led["total"] == ref.total and led["fits"] == [True] * 4
    rec = calculator.model.recommend({"preset": "llama-7b", "gpu": "H100 80GB", "nodes": 4,
                                      "activation_gb": 20})
    assert rec["choice"] == "HYBRID_SHARD" and "HSDP" in rec["reason"]
    assert rec["label"] == "FSDP HYBRID_SHARD" and not rec["checkpointing"] and not rec["offload"]
    assert [o["label"] for o in rec["ladder"]][:3] == ["DDP", "FSDP HYBRID_SHARD", "FSDP FULL_SHARD"]
    one = calculator.model.recommend({"preset": "llama-7b", "gpu": "H100 80GB", "activation_gb": 20})
    assert one["choice"] == "SHARD_GRAD_OP" and not one["options"]["ZeRO-1"]["fits"]
    assert one["options"]["ZeRO-1"]["memory_bytes"] == 9 * p.num_params + 20e9  # 8P + 8P/8 + A
    big = calculator.model.recommend({"preset": "llama-70b", "gpu": "H100 80GB", "activation_gb": 20})
    assert big["choice"] == "FULL_SHARD" and big["offload"] and big["label"].endswith("CPU offload")
    assert calculator.model.step_bytes({"param_bytes": 8, "strategy": "DDP", "nodes": 1,
                                        "gpus_per_node": 2})["total"] == 8
    assert calculator.model.ledger({"num_params": 0})["error"].startswith("num_params phải")


def test_bad_calculator_arguments_are_refused():
    with pytest.raises(ValueError, match="panel="):
        calculator.calculator("sổ")
    with pytest.raises(ValueError, match="key là tiền tố"):
        calculator.calculator("ledger", key="a&b")
    with pytest.raises(ValueError, match="khác nhau"):
        calculator.calculator("ledger", "ledger")


# --- random inputs, the same for Python and JavaScript

def _num_params(rng):
    return rng.choice([rng.randint(1, 10**4), rng.randint(10**6, 10**9), rng.randint(10**9, 2 * 10**11)])


def _model(rng, unit="largest_unit_params", root="root_unit_params"):
    if rng.random() < 0.3:
        return {"preset": rng.choice(list(presets()))}
    p = _num_params(rng)
    a = rng.randint(0, p // 4) if rng.random() < 0.7 else 0
    return {"num_params": p, unit: a, root: rng.randint(0, (p - a) // 3)}


def _ledger_case(rng):
    n = rng.choice([1, 2, 3, 4, 6, 8, 16, 64, 512])
    strategy = rng.choice(memory.STRATEGIES)
    shard = rng.choice([d for d in range(1, n + 1) if n % d == 0])
    offload = {"offload": rng.random() < 0.5} if strategy in memory.OFFLOAD_STRATEGIES else {}
    return {**_model(rng), "world_size": n, "strategy": strategy, "shard_size": shard,
            "precision": rng.choice(memory.PRECISIONS), "optimizer": rng.choice(memory.OPTIMIZERS),
            "phase": rng.choice(memory.PHASES),
            "activation_bytes": rng.choice([0.0, rng.uniform(0, 1e11)]), **offload}


def _network(rng):
    return {"nodes": rng.choice([1, 1, 2, 3, 4, 16]), "gpus_per_node": rng.choice([1, 2, 4, 8])}


def _bytes_case(rng):
    pb = rng.choice([rng.randint(0, 10**12), rng.uniform(0, 1e12)])
    return {"param_bytes": pb, "strategy": rng.choice(costs.STRATEGIES), **_network(rng),
            "root_bytes": rng.choice([0, rng.uniform(0, pb)])}


def _time_case(rng):
    return {**_bytes_case(rng), "compute_seconds": rng.uniform(0, 2), "messages": rng.randint(1, 200),
            "alpha_intra": rng.uniform(0, 1e-4), "bandwidth_intra": rng.uniform(1e9, 1e12),
            "alpha_inter": rng.uniform(0, 1e-4), "bandwidth_inter": rng.uniform(1e8, 1e11)}


def _recommend_case(rng):
    m = _model(rng)
    return {**m, "gpu": rng.choice([c.name for c in memory.CARDS]), **_network(rng),
            "precision": rng.choice(memory.PRECISIONS), "optimizer": rng.choice(memory.OPTIMIZERS),
            "activation_gb": rng.choice([0, rng.uniform(0, 80)]),
            "headroom": rng.choice([0, 0.1, rng.uniform(0, 0.5)]),
            "allow_checkpointing": rng.random() < 0.8, "allow_offload": rng.random() < 0.8,
            "host_gb": rng.choice([2000.0, rng.uniform(0, 4000), 0])}


GOOD = {"ledger": _ledger_case, "stepBytes": _bytes_case, "stepTime": _time_case,
        "recommend": _recommend_case}
BAD = {  # inputs the Python refuses, each with its own message
    "ledger": [{"num_params": 0}, {"num_params": 1.5}, {"num_params": 10, "world_size": -1},
               {"num_params": 10, "strategy": "ZeRO-4"}, {"num_params": 10, "phase": "peak"},
               {"num_params": 10, "world_size": 8, "strategy": "HYBRID_SHARD", "shard_size": 3},
               {"num_params": 10, "world_size": 8, "strategy": "HYBRID_SHARD", "shard_size": None},
               {"num_params": 10, "largest_unit_params": 8, "root_unit_params": 3},
               {"num_params": 10, "activation_bytes": -1}, {"num_params": 10, "precision": "fp8"},
               {"num_params": 10, "optimizer": "lion"}, {"preset": "gpt-5"},
               {"num_params": 10, "strategy": "ZeRO-1", "offload": True},
               {"num_params": 10, "strategy": "FULL_SHARD", "offload": 1}],
    "stepBytes": [{"param_bytes": 4, "strategy": "DDP", "nodes": 0, "gpus_per_node": 8},
                  {"param_bytes": 4, "strategy": "DDP", "nodes": 1, "gpus_per_node": 1.5},
                  {"param_bytes": 4, "strategy": "ZeRO-1", "nodes": 1, "gpus_per_node": 8},
                  {"param_bytes": -4, "strategy": "DDP", "nodes": 1, "gpus_per_node": 8},
                  {"param_bytes": 4, "strategy": "FULL_SHARD", "nodes": 2, "gpus_per_node": 8,
                   "root_bytes": 5}],
    "stepTime": [dict(_time_case(random.Random(k)), **bad) for k, bad in enumerate(
        [{"bandwidth_intra": 0}, {"bandwidth_inter": -10**9}, {"alpha_intra": -1e-6},
         {"alpha_inter": -1}, {"messages": 0}, {"compute_seconds": -0.5},
         {"strategy": "ZeRO-3"}, {"nodes": 0}])],
    "recommend": [{"num_params": 10, "gpu": "V100"}, {"preset": "gpt-5", "gpu": "H200"},
                  {"num_params": 10, "gpu": "H200", "headroom": 1},
                  {"num_params": 10, "gpu": "H200", "headroom": -0.1},
                  {"num_params": 10, "gpu": "H200", "activation_gb": -1},
                  {"num_params": 10, "gpu": "H200", "largest_unit_params": 11},
                  {"num_params": 10, "gpu": "H200", "largest_unit_params": 6, "root_unit_params": 6},
                  {"num_params": 10, "gpu": "H200", "nodes": 0},
                  {"num_params": 10, "gpu": "H200", "precision": "int8"},
                  {"num_params": 10, "gpu": "H200", "allow_checkpointing": 1},
                  {"num_params": 10, "gpu": "H200", "allow_offload": "có"},
                  {"num_params": 10, "gpu": "H200", "host_gb": -1}],
}


def _differences(py, js, where="") -> list[str]:
    if isinstance(py, dict) and isinstance(js, dict):
        if set(py) != set(js):
            return [f"{where}: khóa {sorted(py)} != {sorted(js)}"]
        return [d for k in py for d in _differences(py[k], js[k], f"{where}.{k}")]
    if isinstance(py, (list, tuple)) and isinstance(js, list) and len(py) == len(js):
        return [d for i, (a, b) in enumerate(zip(py, js)) for d in _differences(a, b, f"{where}[{i}]")]
    if isinstance(py, bool) or isinstance(js, bool) or py is None or isinstance(py, str):
        return [] if py == js else [f"{where}: {py!r} != {js!r}"]
    if isinstance(py, (int, float)) and isinstance(js, (int, float)):
        if py == js or abs(py - js) <= 1e-9 * max(abs(py), abs(js)):
            return []
        return [f"{where}: {py!r} != {js!r}"]
    return [f"{where}: {py!r} != {js!r}"]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    path = tmp_path_factory.mktemp("calc") / "calc.html"
    path.write_text(calculator.calculator().standalone_html(), encoding="utf-8")
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        context = browser.new_context(offline=True)
        pg = context.new_page()
        pg.on("pageerror", lambda e: problems.append(f"JS error: {e}"))
        pg.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
        pg.route("http*://**", lambda route: (problems.append(f"network: {route.request.url}"),
                                              route.abort()))
        pg.goto(path.as_uri() + "#foreign=1&ledger_traffic_decision.ledger.world_size=64")
        pg.uri = path.as_uri()
        yield pg
        browser.close()
    assert problems == [], problems


@NEEDS_CHROMIUM
@pytest.mark.parametrize("name", list(GOOD))
def test_javascript_equals_python(page, name):
    rng = random.Random(name)
    cases = [GOOD[name](rng) for _ in range(CASES)] + BAD[name]
    js = page.evaluate(f"cases => cases.map(c => window.dpbookCalc.{name}(c))", cases)
    py = [calculator.TWINS[name](c) for c in cases]
    assert sum("error" in r for r in py[:CASES]) < CASES / 20  # the random cases are valid ones
    if name == "recommend":  # the random jobs climb to every tier of the ladder, and past it
        reached = {(r["checkpointing"], r["offload"]) for r in py[:CASES] if r.get("choice")}
        assert reached == set(decision.TIERS) and any(r.get("choice", 0) is None for r in py)
    assert all("error" in r for r in py[CASES:]), [c for c, r in zip(BAD[name], py[CASES:])
                                                     if "error" not in r]
    found = [f"{json.dumps(c, ensure_ascii=False)}: {d}" for c, a, b in zip(cases, py, js)
             for d in _differences(a, b)]
    assert not found, f"{len(found)} khác biệt:\n" + "\n".join(found[:10])


@NEEDS_CHROMIUM
def test_javascript_numbers_are_vi(page):
    rng = random.Random(7)
    xs = [rng.choice([rng.uniform(0, 10), rng.uniform(0, 1e13), rng.randint(0, 10**6) / 8,
                      rng.randint(0, 10**4) / 1000, -rng.uniform(0, 100), 0.0]) for _ in range(CASES)]
    specs = [(x, rng.randint(0, 3), rng.random() < 0.5, rng.choice(["", " ", vi.NARROW_NBSP]),
              rng.random() < 0.2) for x in xs]
    js = page.evaluate("""specs => specs.map(([x, d, trim, group, sign]) => [
        window.dpbookCalc.vi.number(x, d, {trim: trim, group: group, sign: sign}),
        window.dpbookCalc.vi.nbytes(Math.abs(x)), window.dpbookCalc.vi.grouped(Math.abs(x)),
        window.dpbookCalc.vi.ms(Math.abs(x) / 1e3, d), window.dpbookCalc.vi.percent(x / 100, d)])""",
                       specs)
    py = [[vi.number(x, d, trim=trim, group=group, sign=sign), vi.nbytes(abs(x)), vi.grouped(abs(x)),
           vi.ms(abs(x) / 1e3, d), vi.percent(x / 100, d)] for x, d, trim, group, sign in specs]
    bad = [(s, a, b) for s, a, b in zip(specs, py, js) if a != b]
    assert not bad, bad[:10]
    assert page.evaluate("window.dpbookCalc.vi.number(0.125, 2)") == vi.number(0.125, 2) == "0,12"
    assert page.evaluate("window.dpbookCalc.repr(1.5e-05)") == repr(1.5e-05)


@NEEDS_CHROMIUM
def test_the_page_reads_and_keeps_its_own_hash_keys(page):
    """The link's inputs are applied, a change writes this calculator's keys only, and the
    panels show the library's numbers and messages."""
    root = page.locator(".dpc").first
    assert root.locator('[data-panel="ledger"] [name="world_size"]').input_value() == "64"
    p = presets()["llama-7b"]
    total = memory.vram_ledger(p.num_params, 64, "FULL_SHARD", precision="mixed", phase="step",
                               largest_unit_params=p.largest_unit, root_unit_params=p.root_unit).total
    text = root.locator('[data-panel="ledger"] .dpc-out').inner_text()
    assert f"{vi.number(total / 1e9, 2, group=vi.NARROW_NBSP)} GB" in text
    root.locator('[data-panel="decision"] [name="nodes"]').fill("4")
    # Read the hash in the page: Playwright's page.url follows history.replaceState through an
    # event that may arrive after fill() returns (it failed once that way).
    page.wait_for_function("location.hash.includes('ledger_traffic_decision.decision.nodes=4')")
    url = page.evaluate("location.href")
    assert "foreign=1" in url and "ledger_traffic_decision.decision.nodes=4" in url
    assert "ledger_traffic_decision.ledger.world_size=64" in url
    rec = calculator.model.recommend({"preset": "llama-7b", "gpu": "H100 80GB", "nodes": 4,
                                      "activation_gb": 20.0, "headroom": 0.1})
    assert rec["reason"] in root.locator('[data-panel="decision"] .dpc-out').inner_text()
    root.locator('[data-panel="traffic"] [name="bandwidth_inter_gbs"]').fill("0")
    err = root.locator('[data-panel="traffic"] .dpc-error').inner_text()
    with pytest.raises(ValueError) as refused:
        costs.step_time(1, "DDP", 4, 8, compute_seconds=0, alpha_intra=0, bandwidth_intra=1,
                        alpha_inter=0, bandwidth_inter=0)
    assert err == str(refused.value) == "bandwidth_inter phải là số dương, nhận được 0."
    root.locator('[data-panel="traffic"] [name="bandwidth_inter_gbs"]').fill("50")
    assert root.locator('[data-panel="traffic"] .dpc-error').inner_text() == ""
    assert root.locator('[data-panel="traffic"] tbody tr').count() == len(costs.STRATEGIES)
