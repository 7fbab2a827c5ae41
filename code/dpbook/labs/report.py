"""What every lab checker prints: one ✓/✗ line per check with a hint, then a verdict.

Bài A, D and E share these: a learner reads the same report whatever the lab."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One check: a key, a Vietnamese title, the verdict, what was seen, how to fix it."""

    key: str
    title: str
    passed: bool
    detail: str = ""
    hint: str = ""

    def __str__(self) -> str:
        text = f"{'✓' if self.passed else '✗'} {self.title}"
        text += f": {self.detail}" if self.detail else ""
        return text + (f"\n    → Gợi ý: {self.hint}" if not self.passed and self.hint else "")


class Verdict:
    """Mixed into a checker's frozen ``Result`` dataclass, which has an ``items`` field."""

    items: tuple[Item, ...]

    @property
    def passed(self) -> bool:
        return all(i.passed for i in self.items)

    @property
    def failed(self) -> list[str]:
        return [i.key for i in self.items if not i.passed]

    def item(self, key: str) -> Item:
        return next(i for i in self.items if i.key == key)

    def report_lines(self, heading: str) -> list[str]:
        """The heading, one line per item, and the verdict line."""
        ok = sum(i.passed for i in self.items)
        return [heading, *map(str, self.items),
                f"==> {'ĐẠT' if self.passed else 'CHƯA ĐẠT'}: {ok}/{len(self.items)} mục."]


def command_line(argv, lab: str, description: str, file_help: str, run, timeout: float,
                 min_nproc: int = 1) -> int:
    """``python -m dpbook.labs.<lab>.checker FILE [--nproc N] [--timeout S]``: every lab's
    checker takes the same options; exit status 0 if every check passes, 1 otherwise, 2 when
    the file cannot be checked at all (``preflight``: one line on stderr, no traceback).
    ``run(file, nproc, timeout)`` returns the lab's ``Result``."""
    import argparse
    import sys

    from .preflight import SubmissionError

    def checked(kind, ok, wanted):
        def parse(text):
            try:
                value = kind(text)
            except ValueError:
                value = None
            if value is None or not ok(value):
                raise argparse.ArgumentTypeError(f"cần {wanted}, nhận được {text!r}")
            return value
        return parse

    parser = argparse.ArgumentParser(prog=f"python -m dpbook.labs.{lab}.checker",
                                     description=description)
    parser.add_argument("file", help=file_help)
    parser.add_argument("--nproc", default=2, help=f"số process, mỗi rank một (mặc định 2, ít "
                        f"nhất {min_nproc})", type=checked(int, lambda n: n >= min_nproc,
                                                          f"số nguyên >= {min_nproc}"))
    parser.add_argument("--timeout", default=timeout, help="thời hạn, giây",
                        type=checked(float, lambda t: 0 < t < float("inf"),
                                        "số giây dương, hữu hạn"))
    args = parser.parse_args(argv)
    try:
        return 0 if run(args.file, args.nproc, args.timeout).passed else 1
    except SubmissionError as exc:
        print(exc, file=sys.stderr)
        return 2
