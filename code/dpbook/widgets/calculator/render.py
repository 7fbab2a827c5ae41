"""The calculators as one HTML fragment: the forms (Vietnamese labels), the tables of
``model.data()`` as JSON, ``calc.js`` (the formulas) and ``ui.js`` (reads the forms, draws the
results, keeps the inputs in the page's URL hash). No network, no kernel: it works from disk.
"""

from __future__ import annotations

import html
import json
import pathlib

from ...checks import one_of
from . import model

HERE = pathlib.Path(__file__).resolve().parent

# (name, label, kind, default): kind "int", "float", a named list of choices ("preset",
# "strategy", "precision", "optimizer", "card") or a tuple of (value, label) choices.
# Inputs are in the units a reader types (GB, µs, GB/s, ms, %); ui.js converts them into the
# library's (bytes, seconds, fractions) before calling window.dpbookCalc.
_PRESET = ("preset", "Mô hình", "preset", "llama-7b")
FIELDS = {
    "ledger": (
        _PRESET,
        ("num_params", "Số tham số P", "int", 6_738_415_616),
        ("largest_unit_params", "Tham số của tầng lớn nhất", "int", 0),
        ("root_unit_params", "Tham số của đơn vị gốc", "int", 0),
        ("world_size", "Số GPU N (world_size)", "int", 8),
        ("strategy", "Chiến lược", "strategy", "FULL_SHARD"),
        ("shard_size", "shard_size (HYBRID_SHARD)", "int", 8),
        ("precision", "Độ chính xác", "precision", "mixed"),
        ("optimizer", "Bộ tối ưu", "optimizer", "adam"),
        ("phase", "Thời điểm", (("step", "trong bước (step)"), ("rest", "lúc nghỉ (rest)")),
         "step"),
        ("activation_gb", "Activation mỗi GPU (GB)", "float", 0.0),
        ("bucket_view", "DDP: gradient_as_bucket_view",
         (("0", "False (mặc định): bucket chép gradient"), ("1", "True: gradient nằm trong bucket")),
         "0"),
    ),
    "traffic": (
        _PRESET,
        ("num_params", "Số tham số P", "int", 6_738_415_616),
        ("root_params", "Tham số gốc không gom lại khi lan truyền ngược (0: như 4.1.8)", "int", 0),
        ("comm_bytes", "Byte mỗi tham số khi gửi", (("2", "2 (bf16/fp16)"), ("4", "4 (fp32)")),
         "2"),
        ("nodes", "Số node", "int", 4),
        ("gpus_per_node", "GPU mỗi node", "int", 8),
        ("alpha_intra_us", "α trong node (µs)", "float", 5.0),
        ("bandwidth_intra_gbs", "Băng thông trong node (GB/s mỗi GPU, mỗi chiều)", "float",
         450.0),
        ("alpha_inter_us", "α giữa các node (µs)", "float", 10.0),
        ("bandwidth_inter_gbs", "Băng thông ra khỏi node (GB/s mỗi node, mỗi chiều)", "float",
         50.0),
        ("compute_ms", "Thời gian tính một bước (ms)", "float", 500.0),
        ("messages", "Số bucket / đơn vị FSDP", "int", 32),
    ),
    "decision": (
        _PRESET,
        ("num_params", "Số tham số P", "int", 6_738_415_616),
        ("largest_unit_params", "Tham số của tầng lớn nhất", "int", 0),
        ("root_unit_params", "Tham số của đơn vị gốc", "int", 0),
        ("gpu", "GPU", "card", "H100 80GB"),
        ("nodes", "Số node", "int", 1),
        ("gpus_per_node", "GPU mỗi node", "int", 8),
        ("precision", "Độ chính xác", "precision", "mixed"),
        ("optimizer", "Bộ tối ưu", "optimizer", "adam"),
        ("activation_gb", "Activation mỗi GPU khi không tính lại (GB)", "float", 20.0),
        ("headroom_pct", "Để trống (% phần cấp phát được)", "float", 10.0),
        ("allow_checkpointing", "Cho phép activation checkpointing", (("1", "có"), ("0", "không")),
         "1"),
        ("allow_offload", "Cho phép CPU offload", (("1", "có"), ("0", "không")), "1"),
        ("host_gb", "Bộ nhớ CPU mỗi node (GB)", "float", 2000.0),
        ("bucket_view", "DDP: gradient_as_bucket_view",
         (("1", "True: gradient nằm trong bucket"), ("0", "False: bucket chép gradient")), "1"),
    ),
}
# What a numeric field takes, in the reader's units: (smallest, largest, smallest excluded,
# largest excluded). The bounds are far past any training job, and low enough that every result
# stays an ordinary number (integers under 2**53, bytes under 1e21, where JavaScript's toFixed
# would switch to an exponent): a typo like 1e30 is refused with the range, not printed.
_COUNT = (0, 10**14, False, False)  # parameters: 100 nghìn tỷ, 50 times the largest model of 2025
LIMITS = {
    "num_params": (1, 10**14, False, False),
    "largest_unit_params": _COUNT,
    "root_unit_params": _COUNT,
    "root_params": _COUNT,
    "world_size": (1, 10**6, False, False),
    "shard_size": (1, 10**6, False, False),
    "nodes": (1, 10**5, False, False),
    "gpus_per_node": (1, 1024, False, False),
    "messages": (1, 10**6, False, False),
    "activation_gb": (0, 10**6, False, False),
    "host_gb": (0, 10**6, False, False),
    "alpha_intra_us": (0, 10**6, False, False),  # one second
    "alpha_inter_us": (0, 10**6, False, False),
    "bandwidth_intra_gbs": (0, 10**6, True, False),  # the time divides by it
    "bandwidth_inter_gbs": (0, 10**6, True, False),
    "compute_ms": (0, 10**7, False, False),  # almost three hours
    "headroom_pct": (0, 100, False, True),  # 100% would leave nothing to use
}
TITLES = {
    "ledger": "Công cụ tính sổ kế toán VRAM mỗi GPU",
    "traffic": "Công cụ tính giao tiếp và thời gian mỗi bước",
    "decision": "Công cụ tính: chọn DDP hay FSDP",
}

_CSS = """
.dpc{font-family:"Liberation Sans",Arial,"Noto Sans","DejaVu Sans",sans-serif;border:1px solid #bbb;
  border-radius:8px;padding:10px;margin:12px 0;background:#fff;color:#111;max-width:100%}
.dpc-title{font-weight:bold;font-size:1.05em;margin-bottom:6px}
.dpc-form{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(15em,100%),1fr));gap:6px 14px;
  margin-bottom:8px}
.dpc-form label{display:flex;flex-direction:column;font-size:0.85em;gap:2px;min-width:0}
.dpc-form input,.dpc-form select{font-size:1em;padding:3px 5px;border:1px solid #888;border-radius:4px;
  min-width:0;max-width:100%;box-sizing:border-box}
.dpc-form input:disabled{background:#eee;color:#555}
.dpc-buttons{display:flex;gap:6px;margin:6px 0}
.dpc-buttons button{font-size:0.95em;padding:4px 10px;border:1px solid #888;border-radius:5px;
  background:#f4f4f4;color:#111;cursor:pointer}
.dpc-error{color:#b3001b;font-weight:bold;min-height:1.2em;overflow-wrap:anywhere}
.dpc-out{overflow-wrap:anywhere}
.dpc-out svg{width:100%;height:auto;display:block}
.dpc-scroll{overflow-x:auto;max-width:100%}
.dpc-out table{border-collapse:collapse;font-size:0.9em;margin:6px 0;overflow-wrap:normal}
.dpc-out th,.dpc-out td{border:1px solid #ccc;padding:3px 7px;text-align:right}
.dpc-out th:first-child,.dpc-out td:first-child{text-align:left}
.dpc-choice{font-size:1.3em;font-weight:bold;margin:4px 0}
.dpc-present{font-size:1.45em}
.dpc-present .dpc-title{font-size:1.3em}
.dpc:fullscreen{overflow:auto;padding:2vh 3vw}
"""


def _field(spec, data: dict) -> str:
    name, label, kind, default = spec
    # ui.js names a field in its messages by the label the reader sees, read off data-label.
    attrs = (f'name="{name}" data-default="{html.escape(str(default))}" '
             f'data-label="{html.escape(label)}"')
    if kind in ("int", "float"):
        low, high, low_open, high_open = LIMITS[name]
        step = "1" if kind == "int" else "any"
        control = (f'<input type="number" {attrs} data-kind="{kind}" step="{step}" '
                   f'min="{low}" max="{high}" data-min="{low}" data-max="{high}" '
                   f'data-min-open="{int(low_open)}" data-max-open="{int(high_open)}" '
                   f'value="{default}">')
    else:
        choices = {
            "preset": [("", "tự nhập")] + [(k, p["label"]) for k, p in data["presets"].items()],
            "strategy": [(s, s) for s in data["memory"]["strategies"]],
            "precision": [(p, p) for p in data["memory"]["precisions"]],
            "optimizer": [(o, o) for o in data["memory"]["optimizers"]],
            "card": [(c["name"], c["name"]) for c in data["cards"]],
        }.get(kind, kind)
        options = "".join(f'<option value="{html.escape(v)}"{" selected" if v == default else ""}>'
                          f"{html.escape(t)}</option>" for v, t in choices)
        control = f'<select {attrs} data-kind="text">{options}</select>'
    return f"<label>{html.escape(label)}{control}</label>"


def panel_html(panel: str, data: dict) -> str:
    one_of("panel", panel, model.PANELS)
    fields = "".join(_field(f, data) for f in FIELDS[panel])
    return (f'<div class="dpc-panel" data-panel="{panel}">'
            f'<div class="dpc-title">{html.escape(TITLES[panel])}</div>'
            f'<form class="dpc-form" onsubmit="return false">{fields}</form>'
            '<div class="dpc-error" aria-live="polite"></div>'
            '<div class="dpc-out" aria-live="polite"></div></div>')


def library() -> str:
    """The formulas and the page logic, as they are shipped (read from the package)."""
    return ((HERE / "calc.js").read_text(encoding="utf-8") + "\n"
            + (HERE / "ui.js").read_text(encoding="utf-8"))


def render(root_id: str, panels, key: str, presentation: bool = False) -> str:
    """One calculator: its panels, the data, the library (it runs once per page: a second copy
    returns at once) and the call that wires this calculator."""
    data = model.data()
    cls = "dpc dpc-present" if presentation else "dpc"
    body = "".join(panel_html(p, data) for p in panels)
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    return (f"<style>{_CSS}</style>"
            f'<script type="application/json" class="dpbook-calc-data">{payload}</script>'
            f'<div id="{root_id}" class="{cls}" data-key="{html.escape(key)}" role="group" '
            'aria-label="Công cụ tính">'
            '<div class="dpc-buttons">'
            '<button type="button" class="dpc-present-btn" title="Chữ to cho máy chiếu">'
            "Trình chiếu</button>"
            '<button type="button" class="dpc-full-btn">Toàn màn hình</button>'
            '<button type="button" class="dpc-reset-btn">Về mặc định</button></div>'
            f"{body}</div>"
            f"<script>{library()}\nwindow.dpbookCalc.mount({json.dumps(root_id)});</script>")
