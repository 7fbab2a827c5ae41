"""The book's execution cache: executed notebooks in jupyter-cache, valid for one set of inputs.

jupyter-cache keys a notebook's outputs on its code cells only. The outputs also depend on the
package the cells import and on the pinned torch, so the cache carries a stamp: the SHA-256 of
the files named by the Sphinx config value ``dpbook_execution_inputs`` in ``_config.yml``. A
cache whose stamp differs is emptied before use. Two writers fill it: the book build
(myst-nb, ``execute_notebooks: cache``) and the notebook tests (``dpbook.tools.nbval_cache``),
so that ``make test`` executes each notebook once and the book is built from that run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
from pathlib import Path

import yaml

STAMP = "dpbook-inputs.sha256"
DEFAULT = Path("_build", ".jupyter_cache")  # myst-nb's default beside _build/html


def cache_folder(app) -> Path:
    """Where a Sphinx build's myst-nb keeps executed outputs (its default: beside the output)."""
    configured = app.config.nb_execution_cache_path
    return Path(configured) if configured else Path(app.outdir).parent / ".jupyter_cache"


def inputs_digest(root: Path, inputs) -> str:
    """SHA-256 over the paths and bytes of every file under ``inputs`` (files or folders,
    relative to ``root``), ignoring Python's byte-code caches."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        base = Path(root, name)
        files = sorted(base.rglob("*")) if base.is_dir() else [base]
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def configured_inputs(root: Path) -> list[str]:
    """``dpbook_execution_inputs`` as ``_config.yml`` gives it to Sphinx."""
    config = yaml.safe_load(Path(root, "_config.yml").read_text(encoding="utf-8"))
    return list(config.get("sphinx", {}).get("config", {}).get("dpbook_execution_inputs", []))


@contextlib.contextmanager
def locked(cache: Path):
    """Hold the cache's lock (two test workers write to it at once)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f".{cache.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_valid(folder: Path, digest: str) -> bool:
    stamp = Path(folder, STAMP)
    return stamp.is_file() and stamp.read_text() == digest


def stamp(folder: Path, digest: str) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, STAMP).write_text(digest)


def ensure_valid(cache: Path, digest: str) -> bool:
    """Empty ``cache`` unless it was filled for ``digest``; True if it was emptied."""
    with locked(cache):
        if is_valid(cache, digest):
            return False
        for entry in cache.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        stamp(cache, digest)
        return True


def add_executed(cache: Path, notebook, path: Path, seconds: float) -> None:
    """Store ``notebook`` (the source of ``path`` with the outputs of a complete, error-free
    run) as myst-nb would after executing it itself."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    with locked(cache):
        get_cache(str(cache)).cache_notebook_bundle(
            CacheBundleIn(notebook, str(Path(path).resolve()),
                          data={"execution_seconds": seconds}),
            check_validity=False, overwrite=True)
