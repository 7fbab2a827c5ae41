"""The book's mechanical style rules (``../shared/notes/thuat-ngu.md``), checked on the source so
that the next page cannot regress.

* Banned forms, in every text a Vietnamese reader sees: the prose of every page (notebook
  markdown cells and ``.md`` pages, formulas included, code left out), the Vietnamese strings of
  the visible code cells (printed reports) and of the package (widget labels, captions, error
  messages). Each rule says what to write instead.
* Numbers in prose: no ``6,738,415,616`` (a Vietnamese reader reads a decimal), no ``2.788``,
  no ``1.5 GB``; thousands grouped by U+202F, not a plain space; four digits and more grouped.
* Numbers a reader sees printed: a visible cell or a Vietnamese string of the package does not
  format a number with Python's own format specs (``:,``, ``:.2f``, ``:g``, ``:.1e``, ``:.1%``),
  which write a decimal point; it calls ``dpbook.vi``.

The built pages' outputs are checked again in ``test_built_book.py``.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

import book_sources

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PKG = ROOT / "code" / "dpbook"

VIETNAMESE = re.compile("[àáạảãâầấậẩẫăằắặẳẵèéẹẻẽêềếệểễìíịỉĩòóọỏõôồốộổỗơờớợởỡùúụủũưừứựửữỳýỵỷỹđ]",
                        re.I)

# (rule, pattern, what to write instead); patterns are case-insensitive.
BANNED = [
    ("ngây thơ", r"ngây thơ", "cách làm trực tiếp; cách tập trung (gom về một chỗ)"),
    ("dưới DDP", r"\bdưới (DDP|FSDP|ZeRO|FULL_SHARD|SHARD_GRAD_OP|HYBRID_SHARD|NO_SHARD|HSDP)",
     "với DDP, khi dùng FSDP"),
    ("mỗi vòng lặp", r"mỗi vòng lặp", "mỗi bước (vòng lặp là chính vòng for)"),
    ("thanh tiến trình", r"thanh tiến trình", "thanh tiến độ"),
    ("tham số dòng lệnh", r"tham số dòng lệnh", "tùy chọn dòng lệnh"),
    ("đóng bóng", r"đóng bóng", "(không phải một từ)"),
    ("tỉ", r"\btỉ\b", "tỷ (tỷ lệ, tỷ số, tỷ tham số)"),
    ("đỉnh bộ nhớ", r"đỉnh bộ nhớ", "bộ nhớ đỉnh"),
    ("tensor song song", r"tensor song song", "song song tensor"),
    ("phép giảm", r"phép giảm", "rút gọn (reduce)"),
    ("phân mảnh bộ nhớ", r"phân mảnh bộ nhớ|bộ nhớ (bị )?phân mảnh",
     "bộ nhớ bị chia vụn (fragmentation); phân mảnh chỉ dùng cho sharding"),
    ("nút", r"\bnút\b(?!\s+(thắt|bấm|nhấn|điều khiển))", "node (máy); nút chỉ dùng cho nút bấm"),
    ("tải", r"(?<!quá )\btải\b(?!\s+(dữ liệu|xuống|của|gói))", "nạp (checkpoint, trọng số); lưu"),
    ("động từ tiếng Anh", r"\b(được|đã|chưa|sẽ|bị) (reduce|assert|AllReduce|AllGather|ReduceScatter|"
     r"Broadcast|all-reduce|allreduce|shard)\b",
     "thực hiện AllReduce trên …, được chia mảnh, ô kiểm tra đã xác nhận"),
    ("loss", r"\bloss\b", "giá trị mất mát, hàm mất mát (`loss` chỉ trong mã)"),
    ("tiến trình", r"(?<!\()tiến trình", "process (chỉ chú thích \"(tiến trình)\" một lần mỗi phần)"),
    ("luồng", r"luồng (dữ liệu|log)", "dòng dữ liệu, dòng log (luồng chỉ là thread)"),
    ("phục vụ", r"phục vụ (mô hình|suy luận)|đi phục vụ|công cụ phục vụ",
     "triển khai để suy luận (serving)"),
    ("animation", r"\banimations?\b", "hình động"),
    ("build", r"\bbuild\b", "dựng sách"),
    ("lỗi chí mạng", r"lỗi chí mạng", "nhược điểm (chỉ giữ khi trích nguyên dàn ý, trong “…”)"),
    ("unit", r"(?<!\()\bunits?\b", "đơn vị (FSDP); chú thích \"(unit)\" khi cần"),
    # the editor's review, §5 (issue 29): one name for one thing
    ("lượt lan truyền ngược", r"lượt lan truyền ngược", "lượt truyền ngược (lan truyền ngược)"),
    ("global batch", r"(?<!`)\bglobal batch\b", "batch toàn cục"),
    ("tác tử", r"tác tử", "agent (của torchrun)"),
]
PROSE_ONLY = [
    ("widget", r"\bwidgets?\b", "hình động, công cụ tính (widget chỉ dùng cho mã ipywidgets)"),
]

NUMBERS = [
    ("dấu phẩy hàng nghìn", r"(?<![\d,])\d{1,3}(?:,\d{3}){2,}(?![\d,])", "6 738 415 616 (U+202F)"),
    ("dấu chấm hàng nghìn", r"(?<![\w.])\d{1,3}\.\d{3}(?![\w.])", "2 788 (U+202F) hoặc 0,875"),
    ("dấu chấm thập phân", r"(?<![\w.])\d+\.\d+\s?(?:lần|GB|MB|KB|kB|MiB|GiB|KiB|ms|µs|s\b|%|×|"
     r"tỷ|triệu|byte|B\b)", "dấu phẩy thập phân: 1,5 GB"),
    ("cách hàng nghìn", r"(?<![\w,.\-])\d{1,3}(?: \d{3})+(?![\d,.])",
     "nhóm hàng nghìn bằng U+202F, không phải dấu cách thường"),
    ("số chưa nhóm", r"(?<![\w.,/\-\u202f])(?<!năm )(?<!RTX )(?<!GTX )\d{4,}(?![\w.,/\-\u202f])",
     "nhóm hàng nghìn: 2 788 (U+202F)"),
]

FLOAT_SPEC = re.compile(r",|\.\d+|[eEfFgG%]$")

FENCE_LINE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*(.*?)[ \t]*$")
# Fenced blocks whose content is code, not prose; every other directive ({exercise},
# {solution}, {note}, {admonition}, {glossary}, ...) holds prose and is read.
CODE_DIRECTIVES = {"code-cell", "code-block", "code", "literalinclude", "mermaid", "raw"}
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
QUOTED = re.compile(r"“[^”]*”")


def _strip_fences(text: str) -> str:
    """The text without its code blocks: fences with a language or none, and code directives;
    the fence lines of prose directives go, their content stays. The glossary's headwords (its
    unindented lines) go too: they are PyTorch's English terms, by design."""
    out, stack = [], []  # stack: (fence, is_code, directive name)
    for line in text.splitlines():
        m = FENCE_LINE.match(line)
        if m:
            fence, info = m.group(1), m.group(2)
            top = stack[-1] if stack else None
            if top and fence[0] == top[0][0] and len(fence) >= len(top[0]) and not info:
                stack.pop()
                continue
            if not (top and top[1]):  # a fence inside code is code
                name = info[1:info.find("}")] if info.startswith("{") else None
                stack.append((fence, name is None or name in CODE_DIRECTIVES, name))
                continue
        if stack and stack[-1][2] == "glossary" and line[:1] not in ("", " ", "\t", ":"):
            continue
        if not (stack and stack[-1][1]):
            out.append(line)
    return "\n".join(out)


def _inline(text: str) -> str:
    """Inline code and link targets removed: what is left reads as Vietnamese."""
    text = re.sub(r"``[^`]+``|`[^`\n]+`", " ", text)
    return re.sub(r"\]\([^)]*\)|https?://\S+", " ", text)


def _without_code(text: str) -> str:
    text = re.sub(r"<!--.*?-->", " ", _strip_fences(text), flags=re.S)
    return re.sub(r"^\s*:[a-z_-]+:.*$", " ", _inline(text), flags=re.M)  # directive options


def prose() -> list[tuple[str, str]]:
    """``(where, text)`` of every page's prose, code removed."""
    out = []
    for page in book_sources.pages():
        name = page.relative_to(BOOK).as_posix()
        if page.suffix == ".md":
            out.append((name, _without_code(page.read_text(encoding="utf-8"))))
            continue
        for cell in book_sources.cells(page, "markdown"):
            out.append((f"{name}, ô {cell.index}", _without_code(cell.source)))
    return out


def cell_python(source: str) -> str:
    """The Python of a code cell: IPython's own transformer turns magics into calls
    (``grads = %ranks pull g`` included); a ``%%ranks`` cell's body is Python run on the ranks,
    so it is kept as code to check, not hidden in a string."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = source.splitlines(True)
    if lines and lines[0].startswith("%%ranks"):
        lines = lines[1:]
    return TransformerManager().transform_cell("".join(lines))


def _code_cells():
    for page in book_sources.pages((".ipynb",)):
        name = page.relative_to(BOOK).as_posix()
        for cell in book_sources.cells(page, "code"):
            if "remove-cell" not in cell.tags:
                yield f"{name}, ô {cell.index}", ast.parse(cell_python(cell.source))


def _sources():
    """``(where, tree)`` of every visible code cell and every module of the package."""
    yield from _code_cells()
    for path in sorted(PKG.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _docstrings(tree) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def strings() -> list[tuple[str, str]]:
    """``(where, text)`` of every Vietnamese string a reader may see: literals, and f-strings
    with ``{}`` for each value; docstrings and inline code (between backticks) left out."""
    out = []
    for where, tree in _sources():
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                skip |= {id(v) for v in node.values}
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                text = node.value
            else:
                continue
            if VIETNAMESE.search(text):
                out.append((where, _inline(text)))
    return out


def float_formats() -> list[str]:
    """Where a visible cell, or a package f-string with Vietnamese text, formats a number with
    a Python format spec that writes a decimal point or comma thousands."""
    out = []
    for where, tree in _sources():
        in_package = where.startswith("code/")
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if in_package and not VIETNAMESE.search(text):
                continue
            for v in node.values:
                if isinstance(v, ast.FormattedValue) and v.format_spec is not None:
                    spec = "".join(p.value for p in v.format_spec.values
                                   if isinstance(p, ast.Constant))
                    if FLOAT_SPEC.search(spec):
                        out.append(f"{where}: {{{ast.unparse(v.value)}:{spec}}}")
    return out


def _find(rules, texts, quoted_ok=("lỗi chí mạng",)) -> list[str]:
    found = []
    for where, text in texts:
        for rule, pattern, instead in rules:
            checked = QUOTED.sub(" ", text) if rule in quoted_ok else text
            for m in re.finditer(pattern, checked, flags=re.I):
                around = checked[max(0, m.start() - 30):m.end() + 30].replace("\n", " ")
                found.append(f"{where}: «{m.group(0)}» ({rule}; viết: {instead}) …{around}…")
    return found


def test_no_banned_form_in_the_prose():
    found = _find(BANNED + PROSE_ONLY, prose())
    assert not found, f"{len(found)} chỗ trái quy ước thuật ngữ:\n" + "\n".join(found)


def test_no_banned_form_in_what_the_code_prints():
    found = _find(BANNED, strings())
    assert not found, f"{len(found)} chuỗi trái quy ước thuật ngữ:\n" + "\n".join(found)


def test_numbers_in_the_prose_follow_the_rules():
    texts = [(where, MATH.sub(" ", text)) for where, text in prose()]
    found = _find(NUMBERS, texts)
    assert not found, f"{len(found)} con số viết sai quy ước:\n" + "\n".join(found)


def test_printed_numbers_go_through_the_formatter():
    found = float_formats()
    assert not found, (f"{len(found)} chỗ định dạng số bằng cú pháp của Python (dấu chấm thập "
                       "phân, dấu phẩy hàng nghìn); hãy dùng dpbook.vi:\n" + "\n".join(found))


@pytest.mark.parametrize("text, rule", [
    ("so với cách ngây thơ", "ngây thơ"), ("bộ nhớ dưới FSDP", "dưới DDP"),
    ("gradient chưa được reduce", "động từ tiếng Anh"), ("6,738,415,616 tham số", "dấu phẩy hàng nghìn"),
    ("có 2.788 tham số", "dấu chấm hàng nghìn"), ("mất 1.5 GB", "dấu chấm thập phân"),
    ("có 2 788 tham số", "cách hàng nghìn"), ("có 2788 tham số", "số chưa nhóm"),
    ("tải checkpoint", "tải"), ("một nút GPU", "nút"),
])
def test_the_rules_catch_what_they_name(text, rule):
    found = _find(BANNED + PROSE_ONLY + NUMBERS, [("mẫu", text)])
    assert any(f"({rule};" in f for f in found), found


@pytest.mark.parametrize("text", [
    "GPU 0 quá tải", "nút thắt cổ chai", "có 2\u202f788 tham số", "0,875 GB", "PyTorch 2.13",
    "mục 4.1.3", "năm 2026", "RTX 3090", "H200 141 GB", "GPT-2 124M", "“Lỗi chí mạng: giới hạn Python GIL”", "tải dữ liệu về đĩa",
])
def test_the_rules_leave_correct_text_alone(text):
    assert _find(BANNED + PROSE_ONLY + NUMBERS, [("mẫu", text)]) == []


def test_exercises_are_read_and_code_is_not():
    text = ("Trước.\n````{exercise}\nCách ngây thơ.\n```python\nloss = 1  # ngây thơ\n```\n````\n"
            "```{literalinclude} x.py\n:pyobject: f\n```\nSau `loss` đó.")
    kept = _without_code(text)
    glossary = _without_code("```{glossary}\nroot unit\n  Đơn vị gốc của FSDP.\n```")
    assert "root unit" not in glossary and "Đơn vị gốc" in glossary
    assert "Cách ngây thơ." in kept and "loss = 1" not in kept and "pyobject" not in kept
    assert "Sau" in kept and "loss" not in kept


def test_the_format_check_sees_python_number_formats(monkeypatch):
    tree = ast.parse('print(f"{x:,} và {y:.2f} GB và {z:>9g} và {w:.1%} và {n:>6} {s}")')
    monkeypatch.setattr(sys.modules[__name__], "_sources", lambda: iter([("mẫu", tree)]))
    assert float_formats() == ["mẫu: {x:,}", "mẫu: {y:.2f}", "mẫu: {z:>9g}", "mẫu: {w:.1%}"]
