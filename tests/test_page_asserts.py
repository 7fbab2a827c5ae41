"""Asserts are evidence: an assert in a page's code must be able to fail. One made only of
literals (``0.01 / 8 == 0.00125``) checks the writer's arithmetic, not the book's code, and one
that compares an expression with itself holds by definition; both are refused here. Each part of
an ``assert a and b`` is judged on its own."""

import ast
import json


def _asserted_parts(source: str):
    # IPython magics and shell lines are not Python: blank them, keeping line numbers
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    text = "\n".join(lines)
    try:
        tree = ast.parse(text)
    except SyntaxError:
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


def test_no_page_assert_cannot_fail(root):
    bad = []
    for path in sorted((root / "book").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            for part, segment in _asserted_parts("".join(cell["source"])):
                if why := _cannot_fail(part):
                    bad.append(f"{path.relative_to(root)} ô {index}: assert {segment} ({why})")
    assert bad == [], "assert không thể sai:\n" + "\n".join(bad)
