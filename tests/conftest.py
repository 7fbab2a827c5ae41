import fcntl
import gc
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from dpbook.tools import execution_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]


def pytest_collection_finish(session):
    """What collection imported (torch, the package, the test modules: about 350 000 objects)
    lives as long as the run: frozen, the collector's full passes walk only what the tests
    create. Over tests/formulas, tests/pages and two measurement files: 15 full passes took
    4.5 s, now 2.3 s."""
    gc.freeze()


@pytest.fixture(scope="session")
def root() -> pathlib.Path:
    return ROOT


def book_config(root: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """``out/_config.yml``: the book's config for a build into ``out``, from the execution cache
    that `make book` uses and that the notebook tests fill: after them the book is built from
    their runs, not executed a second time (dpbook.tools)."""
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["bibtex_bibfiles"] = [str(root / b) for b in config["bibtex_bibfiles"]]
    config["execute"]["cache"] = str(root / execution_cache.DEFAULT)
    cfg = out / "_config.yml"
    cfg.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return cfg


# The book built once for the session's built-book tests (tests/test_built_book*.py), shared by
# the xdist workers of one run: the first to get the lock builds, the others wait and read it.
@pytest.fixture(scope="session")
def built(root, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """The book built as HTML into a fresh folder: (that folder, the config it was built with)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's own folder, above each worker's
    out = base / "book"
    cfg = out / "_config.yml"
    with open(base / "book.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        failed = out / "build-failed.txt"
        if failed.exists():
            pytest.fail(failed.read_text(encoding="utf-8"), pytrace=False)
        if not (out / "built.ok").exists():
            book_config(root, out)
            jb = pathlib.Path(sys.executable).with_name("jupyter-book")
            proc = subprocess.run(
                [str(jb), "build", str(root), "-W", "--keep-going", "--config", str(cfg),
                 "--path-output", str(out)],
                capture_output=True, text=True, timeout=900,
                env=os.environ | {"PYTHONWARNINGS": ""},
            )
            if proc.returncode:
                failed.write_text(proc.stdout[-5000:] + proc.stderr[-3000:], encoding="utf-8")
                pytest.fail(failed.read_text(encoding="utf-8"), pytrace=False)
            (out / "built.ok").write_text("")
    return out, cfg


@pytest.fixture(scope="session")
def html(built) -> pathlib.Path:
    return built[0] / "_build" / "html"
