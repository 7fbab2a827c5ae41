"""The Vietnamese command line of the book's scripts, kept out of the scripts themselves.

A script writes ``p = vietnamese_parser(prog=..., description=...)`` and then ordinary
``argparse`` calls; this module makes argparse answer in Vietnamese without ``gettext``:

* ``cách dùng:`` instead of ``usage:``, ``tùy chọn`` / ``đối số vị trí`` as section titles, and
  ``-h, --help`` described in Vietnamese;
* an error is the usage line, then ``<script>: lỗi: <message>`` (``<script>``: the last dotted
  part of ``prog``, ``ddp_script``), argparse's standard messages translated by ``MESSAGES``
  (an English message not in the table is shown as it is);
* under ``torchrun`` every worker parses the same command line and prints the same error: the
  first worker to exit makes torchrun stop the others, so a message printed by one chosen rank
  only could be cut off.
"""

from __future__ import annotations

import argparse
import re
import sys

USAGE = "cách dùng: "
TYPES = {"int": "số nguyên", "float": "số thực"}


def _invalid_value(m: re.Match) -> str:
    kind = TYPES.get(m["type"])
    return (f"{m['value']} không phải {kind}" if kind
            else f"giá trị {m['value']} không hợp lệ ({m['type']})")


# argparse's messages (Python 3.10 to 3.13; the part after "argument X: " for per-argument ones)
# and their Vietnamese. A replacement is a format string over the named groups, or a function.
MESSAGES: list[tuple[str, object]] = [
    (r"the following arguments are required: (?P<names>.+)", "thiếu đối số bắt buộc: {names}"),
    (r"unrecognized arguments: (?P<args>.*)", "đối số không nhận ra: {args}"),
    (r"invalid choice: (?P<value>.+?) \(choose from (?P<choices>.+)\)",
     "{value} không phải lựa chọn hợp lệ (chọn một trong {choices})"),
    (r"invalid (?P<type>\S+) value: (?P<value>.+)", _invalid_value),
    (r"expected one argument", "thiếu giá trị (cần đúng một giá trị)"),
    (r"expected at most one argument", "chỉ nhận nhiều nhất một giá trị"),
    (r"expected at least one argument", "thiếu giá trị (cần ít nhất một giá trị)"),
    (r"expected (?P<n>\d+) arguments?", "cần đúng {n} giá trị"),
    (r"ignored explicit argument (?P<value>.+)",
     "tùy chọn này không nhận giá trị, nhưng được cho {value}"),
    (r"not allowed with argument (?P<other>.+)", "không dùng được cùng với {other}"),
    (r"one of the arguments (?P<names>.+) is required", "cần một trong các đối số {names}"),
    (r"ambiguous option: (?P<option>.+?) could match (?P<matches>.+)",
     "tùy chọn {option} không rõ: có thể là {matches}"),
]


def translate(message: str) -> str:
    """argparse's English ``message`` in Vietnamese (unchanged when the table lacks it)."""
    m = re.fullmatch(r"argument (?P<arg>.+?): (?P<rest>.*)", message, re.DOTALL)
    if m:
        return f"đối số {m['arg']}: {translate(m['rest'])}"
    for pattern, vi in MESSAGES:
        m = re.fullmatch(pattern, message, re.DOTALL)
        if m:
            return vi(m) if callable(vi) else vi.format(**m.groupdict())
    return message


class _Formatter(argparse.HelpFormatter):
    def add_usage(self, usage, actions, groups, prefix=None):
        super().add_usage(usage, actions, groups, USAGE if prefix is None else prefix)


class VietnameseParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose help and errors are Vietnamese (see the module)."""

    def __init__(self, *args, add_help: bool = True, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, add_help=False, **kwargs)
        self._positionals.title = "đối số vị trí"
        self._optionals.title = "tùy chọn"
        if add_help:
            self.add_argument("-h", "--help", action="help", default=argparse.SUPPRESS,
                              help="in hướng dẫn này rồi thoát")

    @property
    def script(self) -> str:
        """The short name in error lines: ``ddp_script`` for ``python -m dpbook.scripts.ddp_script``."""
        return self.prog.split()[-1].rsplit(".", 1)[-1]

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.script}: lỗi: {translate(message)}\n")


def vietnamese_parser(**kwargs) -> VietnameseParser:
    """An ``ArgumentParser`` (same keyword arguments) that speaks Vietnamese."""
    return VietnameseParser(**kwargs)
