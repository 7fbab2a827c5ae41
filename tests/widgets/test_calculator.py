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
    # DDP: the bucket copy of the gradients is its own row (bf16 gradients: 2 B each)
    ddp = calculator.model.ledger({"preset": "llama-7b", "strategy": "DDP", "precision": "mixed"})
    assert ddp["buffers"] == 2 * p.num_params and ddp["total"] == ddp["state"] + ddp["buffers"]
    view = calculator.model.ledger({"preset": "llama-7b", "strategy": "DDP", "bucket_view": True})
    assert view["buffers"] == 0 and view["total"] == view["state"] == 16 * p.num_params
    rec = calculator.model.recommend({"preset": "llama-7b", "gpu": "H100 80GB", "nodes": 4,
                                      "activation_gb": 20})
    assert rec["choice"] == "HYBRID_SHARD" and "HSDP" in rec["reason"]
    assert rec["label"] == "FSDP HYBRID_SHARD" and not rec["checkpointing"] and not rec["offload"]
    assert [o["label"] for o in rec["ladder"]][:3] == ["DDP", "FSDP HYBRID_SHARD", "FSDP FULL_SHARD"]
    one = calculator.model.recommend({"preset": "llama-7b", "gpu": "H100 80GB", "activation_gb": 20})
    assert one["choice"] == "SHARD_GRAD_OP" and not one["options"]["ZeRO-1"]["fits"]
    assert one["options"]["ZeRO-1"]["memory_bytes"] == 9 * p.num_params + 20e9  # 8P + 8P/8 + A
    # the job's default is gradient_as_bucket_view=True; PyTorch's default adds the 4P copy
    copy = calculator.model.recommend({"preset": "llama-7b", "gpu": "H100 80GB", "activation_gb": 20,
                                       "bucket_view": False})
    assert copy["options"]["ZeRO-1"]["memory_bytes"] == 13 * p.num_params + 20e9
    assert copy["options"]["DDP"]["memory_bytes"] - one["options"]["DDP"]["memory_bytes"] == \
        decision.bucket_copy_bytes(decision.Job(p.num_params, memory.card("H100 80GB")))
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
    view = {"bucket_view": rng.random() < 0.5} if rng.random() < 0.6 else {}
    return {**_model(rng), **view, "world_size": n, "strategy": strategy, "shard_size": shard,
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
            "host_gb": rng.choice([2000.0, rng.uniform(0, 4000), 0]),
            **({"bucket_view": rng.random() < 0.5} if rng.random() < 0.6 else {})}


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
               {"num_params": 10, "strategy": "FULL_SHARD", "offload": 1},
               {"num_params": 10, "bucket_view": "có"}],
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
                  {"num_params": 10, "gpu": "H200", "bucket_view": 0},
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
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def calc_uri(tmp_path_factory):
    path = tmp_path_factory.mktemp("calc") / "calc.html"
    path.write_text(calculator.calculator().standalone_html(), encoding="utf-8")
    return path.as_uri()


def _open(browser, uri, problems, **context_args):
    """The standalone calculator in a fresh offline context; JS errors, console errors and any
    network request are collected in ``problems``."""
    pg = browser.new_context(offline=True, **context_args).new_page()
    pg.on("pageerror", lambda e: problems.append(f"JS error: {e}"))
    pg.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
    pg.route("http*://**", lambda route: (problems.append(f"network: {route.request.url}"),
                                          route.abort()))
    pg.goto(uri)
    pg.uri = uri
    return pg


@pytest.fixture(scope="module")
def page(browser, calc_uri):
    problems: list[str] = []
    yield _open(browser, calc_uri + "#foreign=1&ledger_traffic_decision.ledger.world_size=64",
                problems)
    assert problems == [], problems


@pytest.fixture
def form(browser, calc_uri):
    """A page of its own, at the default inputs, for a test that types into the forms."""
    problems: list[str] = []
    pg = _open(browser, calc_uri, problems)
    yield pg
    pg.context.close()
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
    # Past 1e21 JavaScript's toFixed writes an exponent; the formatter still prints Python's digits.
    huge = [1e21, 1e30, 123456789e20, 2.0**80 + 2.0**28]
    js = page.evaluate("""xs => xs.map(x => [window.dpbookCalc.vi.number(x, 1),
        window.dpbookCalc.vi.nbytes(x), window.dpbookCalc.vi.ms(x), window.dpbookCalc.vi.grouped(x)])""",
                       huge)
    assert js == [[vi.number(x, 1), vi.nbytes(x), vi.ms(x), vi.grouped(x)] for x in huge]


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
    # The library speaks Python; the form names the field as the reader sees it.
    assert str(refused.value) == "bandwidth_inter phải là số dương, nhận được 0."
    assert err == ("“Băng thông ra khỏi node (GB/s mỗi node, mỗi chiều)” phải là số lớn hơn 0 và "
                   f"không quá {vi.grouped(10**6)}, nhận được 0.")
    root.locator('[data-panel="traffic"] [name="bandwidth_inter_gbs"]').fill("50")
    assert root.locator('[data-panel="traffic"] .dpc-error').inner_text() == ""
    assert root.locator('[data-panel="traffic"] tbody tr').count() == len(costs.STRATEGIES)


# --- the forms: what a reader types, and what the calculator answers

FIELDS = calculator.render.FIELDS
LABELS = {(panel, f[0]): f[1] for panel, specs in FIELDS.items() for f in specs}
NUMERIC = [(panel, f[0]) for panel, specs in FIELDS.items() for f in specs if f[2] in ("int", "float")]
G = vi.grouped


def _panel(pg, panel):
    return pg.locator(f'.dpc [data-panel="{panel}"]').first


def _type(pg, panel, field, value):
    """Type ``value`` into ``field`` of ``panel`` ("tự nhập" chosen first where a preset holds
    the field); return the panel's error line and its output."""
    p = _panel(pg, panel)
    if p.locator(f'[name="{field}"]').is_disabled():
        p.locator('[name="preset"]').select_option("")
    p.locator(f'[name="{field}"]').fill(value)
    return p.locator(".dpc-error").inner_text(), p.locator(".dpc-out").inner_text()


def _speaks_the_form(message):
    """No name of the library's arguments outside the quoted labels."""
    import re
    bare = re.sub(r"“[^”]*”", "", message)
    return not re.search(r"\b[a-z]+(_[a-z]+)+\b|\bnodes\b|\bheadroom\b", bare), bare


@NEEDS_CHROMIUM
def test_a_bad_value_is_named_by_its_label_and_quoted_as_typed(form):
    err, out = _type(form, "ledger", "activation_gb", "-1")
    assert err == f"“Activation mỗi GPU (GB)” phải là số từ 0 đến {G(10**6)}, nhận được -1."
    assert out == ""
    _type(form, "ledger", "activation_gb", "0")
    err, _ = _type(form, "decision", "activation_gb", "-1.5")
    assert err == ("“Activation mỗi GPU khi không tính lại (GB)” phải là số từ 0 đến "
                   f"{G(10**6)}, nhận được -1,5.")
    err, _ = _type(form, "traffic", "nodes", "2.5")
    assert err == f"“Số node” phải là số nguyên từ 1 đến {G(10**5)}, nhận được 2,5."
    _type(form, "decision", "activation_gb", "20")
    err, _ = _type(form, "decision", "headroom_pct", "100")
    assert err == "“Để trống (% phần cấp phát được)” phải là số từ 0 đến dưới 100, nhận được 100."
    _type(form, "decision", "headroom_pct", "10")
    _type(form, "traffic", "nodes", "4")
    # A rule between two fields is the library's; its message is read in the form's words too.
    _type(form, "traffic", "num_params", "10")
    err, out = _type(form, "traffic", "root_params", "20")
    assert err == ("“Tham số gốc không gom lại khi lan truyền ngược (0: như 4.1.8)” phải nằm trong "
                   "[0, “Số tham số P”], nhận được 20.") and out == ""
    _type(form, "traffic", "root_params", "0")
    form.locator('.dpc [data-panel="ledger"] [name="strategy"]').select_option("HYBRID_SHARD")
    err, out = _type(form, "ledger", "shard_size", "3")
    assert err == ("HYBRID_SHARD cần “shard_size (HYBRID_SHARD)” là ước số nguyên dương của "
                   "“Số GPU N (world_size)” = 8 (thường là số GPU mỗi máy), nhận được 3.")
    _type(form, "ledger", "shard_size", "8")
    _type(form, "decision", "num_params", "10")
    for field, value in (("largest_unit_params", "11"), ("root_unit_params", "11")):
        err, _ = _type(form, "decision", field, value)
        assert err and _speaks_the_form(err)[0], err
        _type(form, "decision", field, "0")
    for panel in FIELDS:
        assert _panel(form, panel).locator(".dpc-error").inner_text() == "", panel


@NEEDS_CHROMIUM
def test_every_empty_field_is_named_and_nothing_is_computed(form):
    import re
    wrong = []
    for panel, field in NUMERIC:
        p = _panel(form, panel)
        default = p.locator(f'[name="{field}"]').get_attribute("data-default")
        err, out = _type(form, panel, field, "")
        said = f"Ô “{LABELS[panel, field]}” đang trống: hãy nhập một số"
        if not err.startswith(said) or out or re.search(r"\bnan\b", p.inner_text(), re.I):
            wrong.append((panel, field, err, out[:100]))
        err, _ = _type(form, panel, field, default)
        if err:
            wrong.append((panel, field, "mặc định bị từ chối", err))
    assert not wrong, wrong
    err, out = _type(form, "decision", "host_gb", "")
    assert err == f"Ô “Bộ nhớ CPU mỗi node (GB)” đang trống: hãy nhập một số từ 0 đến {G(10**6)}."
    assert out == "" and "Không phương án nào vừa" not in _panel(form, "decision").inner_text()
    err, out = _type(form, "traffic", "compute_ms", "")
    assert err == f"Ô “Thời gian tính một bước (ms)” đang trống: hãy nhập một số từ 0 đến {G(10**7)}."
    assert out == ""
    err, _ = _type(form, "ledger", "world_size", "")
    assert err == f"Ô “Số GPU N (world_size)” đang trống: hãy nhập một số nguyên từ 1 đến {G(10**6)}."


@NEEDS_CHROMIUM
def test_huge_values_are_refused_with_the_allowed_range(form):
    err, out = _type(form, "traffic", "compute_ms", "1e30")
    assert err == f"“Thời gian tính một bước (ms)” phải là số từ 0 đến {G(10**7)}, nhận được 1e30."
    assert out == ""
    _type(form, "traffic", "compute_ms", "500")
    err, out = _type(form, "ledger", "num_params", "1e30")
    assert err == f"“Số tham số P” phải là số nguyên từ 1 đến {G(10**14)}, nhận được 1e30."
    _type(form, "ledger", "num_params", "6738415616")
    # The largest value a field takes still prints as numbers, the bars' labels included.
    wrong = []
    for panel, field in NUMERIC:
        low, high, _, high_open = calculator.render.LIMITS[field]
        p = _panel(form, panel)
        default = p.locator(f'[name="{field}"]').get_attribute("data-default")
        err, out = _type(form, panel, field, str(high - 1 if high_open else high))
        text = p.inner_text() + " ".join(p.locator("svg text").all_text_contents())
        if any(bad in text for bad in ("e+", "nan", "Infinity", "undefined")) or (
                err and not _speaks_the_form(err)[0]):
            wrong.append((panel, field, err, text[-300:]))
        _type(form, panel, field, default)
    assert not wrong, wrong
    _panel(form, "ledger").locator('[name="preset"]').select_option("llama-7b")
    _type(form, "ledger", "activation_gb", str(10**6))
    p = presets()["llama-7b"]
    total = memory.vram_ledger(p.num_params, 8, "FULL_SHARD", precision="mixed", phase="step",
                               largest_unit_params=p.largest_unit, root_unit_params=p.root_unit,
                               activation_bytes=1e15).total
    assert f"↑ {vi.nbytes(total)}" in _panel(form, "ledger").locator("svg text").all_text_contents()


@NEEDS_CHROMIUM
def test_a_phone_sees_the_whole_calculator(browser, calc_uri):
    """On a 390 px wide phone nothing is cut: the page is no wider than the screen, and a table
    wider than the screen scrolls sideways inside its own box, which the screen holds."""
    problems: list[str] = []
    pg = _open(browser, calc_uri, problems, viewport={"width": 390, "height": 844},
               device_scale_factor=3, is_mobile=True, has_touch=True)
    seen = pg.evaluate("""() => {
        const W = document.documentElement.clientWidth, cut = [];
        const scrolls = e => ["auto", "scroll"].includes(getComputedStyle(e).overflowX);
        const box = e => { for (let b = e.parentElement; b && b !== document.body; b = b.parentElement) {
                             if (scrolls(b)) { return b; } } return null; };
        document.querySelectorAll(".dpc *").forEach(e => {
          const r = e.getBoundingClientRect(), b = box(e);
          if (r.width === 0 || e.closest("svg") && e.tagName !== "svg") { return; }
          if (b) {
            const s = b.getBoundingClientRect();
            if (s.left < 0 || s.right > W + 0.5) { cut.push("box " + b.className); }
          } else if (r.left < -0.5 || r.right > W + 0.5) {
            cut.push(e.tagName + "." + e.className + " " + Math.round(r.left) + ".." + Math.round(r.right));
          }
        });
        const tables = [...document.querySelectorAll(".dpc table")].map(t => {
          const b = box(t);
          const r = t.getBoundingClientRect();
          return {fits: r.left >= 0 && r.right <= W,
                  scrolls: !!b && b.scrollWidth >= Math.floor(r.width) && b.clientWidth <= W,
                  width: r.width, box: b && [b.scrollWidth, b.clientWidth]};
        });
        return {width: W, inner: window.innerWidth, scrollWidth: document.documentElement.scrollWidth, cut, tables};
    }""")
    pg.context.close()
    assert problems == [], problems
    assert seen["width"] == seen["inner"] == 390, seen  # not zoomed out to fit a wider page
    assert seen["scrollWidth"] <= 390, seen
    assert not seen["cut"], seen["cut"][:10]
    assert len(seen["tables"]) == 2 and all(t["fits"] or t["scrolls"] for t in seen["tables"]), seen
