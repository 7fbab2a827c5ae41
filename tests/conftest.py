import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from dpbook.tools import execution_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> pathlib.Path:
    return ROOT


# The book built once for the session's built-book tests (tests/test_built_book*.py).
@pytest.fixture(scope="session")
def built(root, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """The book built as HTML into a fresh folder: (that folder, the config it was built with)."""
    out = tmp_path_factory.mktemp("book")
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["bibtex_bibfiles"] = [str(root / b) for b in config["bibtex_bibfiles"]]
    # The execution cache that `make book` uses and that the notebook tests fill: after them
    # the book is built from their runs, not executed a second time (dpbook.tools).
    config["execute"]["cache"] = str(root / execution_cache.DEFAULT)
    cfg = out / "_config.yml"
    cfg.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    jb = pathlib.Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", str(root), "-W", "--keep-going", "--config", str(cfg),
         "--path-output", str(out)],
        capture_output=True, text=True, timeout=900, env=os.environ | {"PYTHONWARNINGS": ""},
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    return out, cfg


@pytest.fixture(scope="session")
def html(built) -> pathlib.Path:
    return built[0] / "_build" / "html"
