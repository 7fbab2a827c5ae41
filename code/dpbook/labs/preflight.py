"""What every lab checker verifies before it starts a single rank: the learner's file exists and
compiles.

Starting ranks costs seconds, and a file that cannot even be compiled fails the same way on
every rank: each check then reports its own ✗ with its own unrelated hint, and the real
``SyntaxError`` comes last, interleaved from several ranks. Caught here, it is one line that
names the file, the line and Python's message. Bài A, D and E call ``source``; the command line
(``report.command_line``) prints ``SubmissionError`` as that one line and exits non-zero.
"""

from __future__ import annotations

import os
from pathlib import Path


class SubmissionError(ValueError):
    """The learner's file cannot be checked (missing, unreadable, does not compile); the
    message is one Vietnamese line. Jupyter shows only the message, as for ``RanksError``:
    the checker's own frames would hide the one line that matters."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def source(path: str | os.PathLike) -> Path:
    """The absolute path of ``path`` once it is a readable file that compiles (``compile()``
    only: nothing of it runs here); raises ``SubmissionError`` otherwise."""
    given = Path(path)
    full = given.resolve()
    shown = str(given) if str(given) == str(full) else f"{given} ({full})"
    if not full.exists():
        raise SubmissionError(f"Không thấy file {shown}: hãy kiểm tra tên file và thư mục hiện "
                              f"tại ({Path.cwd()}); bộ kiểm tra cần đường dẫn tới file .py của "
                              "bạn.")
    if not full.is_file():
        raise SubmissionError(f"{shown} không phải một file: bộ kiểm tra cần đường dẫn tới file "
                              ".py của bạn.")
    try:
        # Bytes, not text: compile() then honours a `# -*- coding: ... -*-` line as Python does.
        data = full.read_bytes()
    except OSError as exc:
        raise SubmissionError(f"Không đọc được file {shown}: {exc.strerror}.") from None
    try:
        compile(data, str(full), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"dòng {exc.lineno}" if exc.lineno else "không rõ dòng"
        raise SubmissionError(f"File {shown} có lỗi cú pháp ở {where}: {_one_line(exc.msg)} "
                              f"({type(exc).__name__}); chưa rank nào được khởi động, hãy sửa "
                              "lỗi rồi chạy lại.") from None
    except ValueError as exc:  # Python 3.11: a NUL byte in the source is a ValueError
        raise SubmissionError(f"File {shown} không phải mã Python hợp lệ: {_one_line(exc)}.") \
            from None
    return full


def _one_line(message) -> str:
    return " ".join(str(message).split())
