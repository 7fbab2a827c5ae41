"""Asserts are evidence: an assert in a page's code must be able to fail. One made only of
literals (``0.01 / 8 == 0.00125``) checks the writer's arithmetic, not the book's code, and one
that compares an expression with itself holds by definition; both are refused here. Each part of
an ``assert a and b`` is judged on its own."""

import ast
import re

import book_sources


def _parse(source: str):
    """``(text, tree)`` of a code cell, or ``(text, None)`` if it is not Python."""
    # IPython magics and shell lines are not Python: blank them, keeping line numbers
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    text = "\n".join(lines)
    try:
        return text, ast.parse(text)
    except SyntaxError:
        return text, None


def _asserted_parts(source: str):
    text, tree = _parse(source)
    if tree is None:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            test = node.test
            parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) \
                else [test]
            for part in parts:
                yield part, ast.get_source_segment(text, part)


def _cannot_fail(node) -> str | None:
    if not any(isinstance(n, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Lambda))
               for n in ast.walk(node)):
        return "chỉ gồm hằng số"
    if isinstance(node, ast.Compare):
        sides = [ast.dump(s) for s in (node.left, *node.comparators)]
        for op, a, b in zip(node.ops, sides, sides[1:]):
            if a == b and isinstance(op, (ast.Eq, ast.Is, ast.LtE, ast.GtE)):
                return "so một biểu thức với chính nó"
    return None


def test_the_lint_finds_what_it_should():
    found = {seg: _cannot_fail(part) for part, seg in _asserted_parts(
        "x = f()\nassert 0.01 / 8 == 0.00125 and x > 0\nassert x == x\nassert g(x) == 2 * x\n")}
    assert found == {"0.01 / 8 == 0.00125": "chỉ gồm hằng số", "x > 0": None,
                     "x == x": "so một biểu thức với chính nó", "g(x) == 2 * x": None}


def _code_cells(root):
    """``(where, source)`` of every code cell of the book's notebooks."""
    for path in book_sources.pages((".ipynb",)):
        for cell in book_sources.cells(path, "code"):
            yield f"{path.relative_to(root)} ô {cell.index}", cell.source


def test_no_page_assert_cannot_fail(root):
    bad = [f"{where}: assert {segment} ({why})" for where, source in _code_cells(root)
           for part, segment in _asserted_parts(source) if (why := _cannot_fail(part))]
    assert bad == [], "assert không thể sai:\n" + "\n".join(bad)


# What only a CPU (gloo) run shows: a device or backend named "cpu"/"gloo", the thread a hook
# ran on, bytes counted on gloo's sockets, an empty GradScaler state (no fp16 on a CPU).
CPU_ONLY = re.compile(r"""(?<!backend=)["']cpu["']|(?<!backend=)["']gloo["']|MainThread|wire|"""
                      r"""scaler["']?\]? == \{\}""")
# A run that forces gloo (backend="gloo") holds on any machine; an assert whose line says why it
# holds on both backends ("# cả hai backend: ...") is taken at its word, and read in review.
BOTH = re.compile(r"#.*cả hai backend")
# An assert that names the mode itself (a conditional expression on the backend or the device)
# or sits under an `if` on it states what holds on both backends.
MODE = re.compile(r"backend|mode|gloo|nccl|cuda|device|gpu|GPU|ON_CPU|on_cpu", re.I)


def _cpu_only_asserts(source: str):
    text, tree = _parse(source)
    if tree is None:
        return

    def visit(node, branched):
        if isinstance(node, ast.Assert):
            segment = ast.get_source_segment(text, node) or ""
            names_mode = any(isinstance(n, ast.IfExp) and MODE.search(
                ast.get_source_segment(text, n.test) or "") for n in ast.walk(node))
            said = BOTH.search(text.splitlines()[node.lineno - 1]) or (
                node.lineno > 1 and BOTH.search(text.splitlines()[node.lineno - 2]))
            names_mode = names_mode or bool(said)
            if CPU_ONLY.search(segment) and not branched and not names_mode:
                yield segment.splitlines()[0]
            return
        if isinstance(node, ast.If):
            under = branched or bool(MODE.search(ast.get_source_segment(text, node.test) or ""))
            for child in node.body + node.orelse:
                yield from visit(child, under)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, branched)

    yield from visit(tree, False)


def test_the_backend_lint_finds_what_it_should():
    found = list(_cpu_only_asserts(
        'assert x.device.type == "cpu"\n'
        'if backend == "gloo":\n    assert wire.sent > 0\n'
        'assert dev == ("cpu" if backend == "gloo" else f"cuda:{r}")\n'
        'assert thread == "MainThread"\n'
        'assert spawn(f, backend="gloo") == [0, 1]\n'
        '# cả hai backend: the script saves CPU tensors\nassert t.device.type == "cpu"\n'))
    assert found == ['assert x.device.type == "cpu"', 'assert thread == "MainThread"']


def test_page_asserts_hold_on_both_backends_or_branch_on_the_mode(root):
    """The review's rule (gpu-path-review, issue 28): an assert that reads a quantity only a CPU
    run has either branches on the mode the page picked or names it."""
    bad = [f"{where}: {a}" for where, source in _code_cells(root)
           for a in _cpu_only_asserts(source)]
    assert bad == [], "assert chỉ đúng trên CPU, không rẽ nhánh theo chế độ:\n" + "\n".join(bad)
