import os
import subprocess
import sys

import pytest

# Line 3 opens a parenthesis that is never closed.
SYNTAX_ERROR = "import torch\n\ndef f(tensor:\n    return tensor\n"


@pytest.fixture
def refuses_without_starting(tmp_path):
    """``refuses_without_starting(lab)``: ``python -m dpbook.labs.<lab>.checker FILE``, run as a
    learner runs it, on a missing file and on a file with a syntax error: each answer is one
    line that names the file (and the line, Python's message), exit status 2, no traceback."""

    def run(lab: str) -> dict[str, str]:
        bad = tmp_path / "co_loi.py"
        bad.write_text(SYNTAX_ERROR, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        outputs = {}
        for case, name in (("missing", "khong_co.py"), ("syntax", bad.name)):
            proc = subprocess.run([sys.executable, "-m", f"dpbook.labs.{lab}.checker", name],
                                  capture_output=True, text=True, timeout=120, cwd=tmp_path,
                                  env=env)
            out = outputs[case] = proc.stdout + proc.stderr
            assert proc.returncode == 2, out
            assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
            assert name in out, out
        assert "Không thấy file" in outputs["missing"]
        assert all(s in outputs["syntax"] for s in ("dòng 3", "'(' was never closed",
                                                    "SyntaxError")), outputs["syntax"]
        return outputs

    return run
