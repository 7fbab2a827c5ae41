"""The package's architecture, checked (``../shared/DESIGN.md``, "The companion package").

Every module of ``dpbook`` belongs to a layer and imports only from its own layer or lower ones,
read from the source with ``ast`` (imports inside functions count: they hide cycles, not remove
them). On top: no import cycles, no ``_private`` name imported from another module, code for one
page does not import another page's, a widget does not import another widget, and the notebooks
import the package by concept name, without aliases, at most six modules each (the vocabulary
modules ``vi`` and ``style`` not counted).

The test started with the old layout's violations in a list that could only shrink; the list
is gone with the last of them, so any violation now fails.
"""

from __future__ import annotations

import ast
import pathlib

import book_sources
from test_style import cell_python

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "code" / "dpbook"

# Layer of each top-level name (module or subpackage), lowest first.
LAYERS = {
    0: ("checks", "vi", "style"),  # shared vocabulary
    1: ("collectives", "costs", "memory", "buckets", "shapes", "averaging", "overlap",
        "decision"),  # formulas, and the decision rule of 4.1.8 built on them
    2: ("models", "data", "launch", "torchrun", "train", "measure", "bench", "tracing", "workers", "gil", "ranks",
        "accumulation", "allocations", "wire"),  # real processes, real models
    3: ("widgets",),
    4: ("pages", "scripts", "labs"),
    5: ("tools", "doctor", "memcheck"),  # doctor: the `python -m dpbook.doctor` entry point of
    # tools.doctor; memcheck: the learner's command that measures a model's memory by strategy
}
LAYER = {name: layer for layer, names in LAYERS.items() for name in names}
SHARED_WIDGET_MODULES = {"player", "svg", "live"}  # what every widget may use
WIDGET_AGGREGATORS = {"export", "__main__"}  # these import every widget on purpose
# 24: measuring took three concepts of its own this round (allocations: the storage census;
# wire: bytes on gloo's sockets; memcheck: the learner's memory command).
MAX_TOP_LEVEL_MODULES = 24
# 7, not 6: pages that show bytes measured on the socket import `measure` beside `costs` (the
# formula), which 4.1.6, 4.1.8 and Bài C now do.
MAX_PAGE_IMPORTS = 7
# How a number looks (``vi``) and the palette (``style``) are not concepts a page teaches: every
# page may print through ``vi`` (``tests/test_style.py`` requires it) without giving up a concept.
NOT_COUNTED = {"dpbook.vi", "dpbook.style"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _target(module: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if node.level == 0:
        return node.module
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: dict[str, pathlib.Path]) -> tuple[dict[str, set[str]], list[str]]:
    """``{module: modules it imports}`` inside the package, and the private names imported."""
    edges: dict[str, set[str]] = {}
    private = []
    for name, path in mods.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                target = _target(name, node, path.name == "__init__.py")
                if not target or target.split(".")[0] != "dpbook":
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        out.add(f"{target}.{alias.name}")
                    else:
                        out.add(target)
                        if alias.name.startswith("_") and target != name:
                            private.append(f"private: {name} imports {target}.{alias.name}")
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.split(".")[0] == "dpbook"}
        edges[name] = {m for m in out if m in mods and m != name}
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _parts(module: str) -> list[str]:
    return module.split(".")[1:]  # without "dpbook"


def placement_problems(mods) -> list[str]:
    out = []
    for name in mods:
        parts = _parts(name)
        if parts and parts[0] not in LAYER:
            out.append(f"unplaced: {name}")
    return out


def edge_problems(edges) -> list[str]:
    out = []
    for a, targets in edges.items():
        pa = _parts(a)
        if not pa or pa[0] not in LAYER:
            continue
        for b in sorted(targets):
            pb = _parts(b)
            if not pb or pb[0] not in LAYER:
                continue
            if LAYER[pb[0]] > LAYER[pa[0]]:
                out.append(f"upward: {a} imports {b}")
            elif pa[0] == pb[0] == "pages" and pa[1:2] != pb[1:2]:
                out.append(f"page to page: {a} imports {b}")
            elif (pa[0] == pb[0] == "widgets" and len(pa) > 1 and len(pb) > 1
                  and pa[1] not in WIDGET_AGGREGATORS and pa[1] != pb[1]
                  and pb[1] not in SHARED_WIDGET_MODULES):
                out.append(f"widget to widget: {a} imports {b}")
    return out


def _notebook_imports(path: pathlib.Path, package: set[str]) -> tuple[set[str], list[str]]:
    """The package modules a notebook imports (``from dpbook.x import name`` counts ``x``
    unless ``name`` is itself a module) and the aliases it gives them."""
    mods, aliases = set(), []
    for cell in book_sources.cells(path, "code"):
        for node in ast.walk(ast.parse(cell_python(cell.source))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dpbook":
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    mods.add(full if full in package else node.module)
                    if a.asname:
                        aliases.append(f"{node.module}.{a.name} as {a.asname}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "dpbook":
                        mods.add(a.name)
                        if a.asname:
                            aliases.append(f"{a.name} as {a.asname}")
    return mods, aliases


def page_problems(package: set[str]) -> list[str]:
    out = []
    for nb in book_sources.pages((".ipynb",)):
        page = nb.relative_to(ROOT / "book").as_posix()
        mods, aliases = _notebook_imports(nb, package)
        out += [f"alias: {page} imports {a}" for a in aliases]
        counted = mods - NOT_COUNTED
        if len(counted) > MAX_PAGE_IMPORTS:
            out.append(f"too many imports: {page} imports {len(counted)} package modules")
        pages = {m for m in mods if m.startswith("dpbook.pages.")}
        if len(pages) > 1:
            out.append(f"several page modules: {page} imports {sorted(pages)}")
    return out


def violations() -> set[str]:
    mods = modules()
    edges, private = imports(mods)
    found = set(private) | set(placement_problems(mods)) | set(edge_problems(edges))
    found |= {"cycle: " + " <-> ".join(c) for c in cycles(edges)}
    found |= set(page_problems(set(mods)))
    top = [n for n in mods if n.count(".") == 1 and not (PKG / _parts(n)[0]).is_dir()]
    if len(top) > MAX_TOP_LEVEL_MODULES:
        found.add(f"too many top-level modules: {len(top)}")
    return found


def test_the_analysis_sees_a_cycle_an_upward_import_and_a_private_name(tmp_path):
    edges = {"dpbook.a": {"dpbook.b"}, "dpbook.b": {"dpbook.a"}, "dpbook.c": set()}
    assert cycles(edges) == [["dpbook.a", "dpbook.b"]]
    assert edge_problems({"dpbook.costs": {"dpbook.launch"}}) == [
        "upward: dpbook.costs imports dpbook.launch"]
    assert edge_problems({"dpbook.pages.ddp": {"dpbook.pages.fsdp"}}) == [
        "page to page: dpbook.pages.ddp imports dpbook.pages.fsdp"]
    assert edge_problems({"dpbook.widgets.ring.render": {"dpbook.widgets.ledger.frames",
                                                         "dpbook.widgets.svg"}}) == [
        "widget to widget: dpbook.widgets.ring.render imports dpbook.widgets.ledger.frames"]
    src = tmp_path / "dpbook"
    src.mkdir()
    (src / "x.py").write_text("def f():\n    from .y import _hidden\n")
    (src / "y.py").write_text("_hidden = 1\n")
    global PKG
    old, PKG = PKG, src
    try:
        edges, private = imports(modules())
    finally:
        PKG = old
    assert edges["dpbook.x"] == {"dpbook.y"}
    assert private == ["private: dpbook.x imports dpbook.y._hidden"]


def test_the_package_keeps_its_layers():
    found = sorted(violations())
    assert not found, "vi phạm kiến trúc gói:\n" + "\n".join(found)
