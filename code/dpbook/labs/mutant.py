"""A wrong version of a lab's code ("mutant") and what its checker must say about it.

Each lab keeps its library in ``lab_*/mutants``; ``tests/labs/test_mutants.py`` runs the checkers
on all of them. A mutant is a file, or, for a one-line slip in a script, the reference with that
line changed (``Edit``): the library then holds the slip, not another copy of the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edit:
    """``reference`` with ``old`` (found there exactly once) replaced by ``new``; ``why`` (one
    line: what is wrong, which item must catch it) replaces the reference's docstring."""

    reference: Path
    old: str
    new: str
    why: str

    def text(self) -> str:
        source = self.reference.read_text(encoding="utf-8")
        if source.count(self.old) != 1:
            raise ValueError(f"{self.reference.name}: đoạn cần sửa phải xuất hiện đúng một lần, "
                             f"thấy {source.count(self.old)} lần: {self.old!r}")
        body = source.replace(self.old, self.new)
        if not body.startswith('"""'):
            raise ValueError(f"{self.reference.name} phải bắt đầu bằng docstring")
        return f'"""{self.why}"""' + body[body.index('"""', 3) + 3:]


@dataclass(frozen=True)
class Mutant:
    """``source`` (a file, or an ``Edit`` of the reference) must fail exactly ``items``, in report
    order, with ``hint`` (a phrase naming the cause) in the hint of the first of them."""

    source: Path | Edit
    items: tuple[str, ...]
    hint: str

    @property
    def doc(self) -> str:
        if isinstance(self.source, Edit):
            return self.source.why
        return self.source.read_text(encoding="utf-8").split('"""')[1]

    def verdict(self, result) -> str | None:
        """None when ``result`` (a checker's report, with ``failed`` and ``item(key)``) fails
        exactly ``items`` with ``hint`` in the first one's hint; otherwise what differs."""
        if tuple(result.failed) != self.items:
            return f"trượt {tuple(result.failed)}, cần {self.items}"
        if self.hint not in result.item(self.items[0]).hint:
            return f"gợi ý của mục {self.items[0]!r} không nhắc {self.hint!r}"
        return None

    def file(self, directory: Path, name: str) -> Path:
        """The file a checker runs: ``source`` itself, or the edited reference written to
        ``directory/name.py``."""
        if isinstance(self.source, Path):
            return self.source
        out = Path(directory) / f"{name}.py"
        out.write_text(self.source.text(), encoding="utf-8")
        return out
