"""pytest plugin: a notebook that nbval ran through without an error goes into the book's
execution cache, so that the book build that follows uses those outputs instead of running the
notebook a second time (``make test`` builds the book after the notebook tests).

Loaded with ``-p dpbook.tools.nbval_cache`` (pyproject's pytest options). Only a notebook whose
every cell ran and passed is stored; a failed, skipped-by-selection or interrupted notebook is
not, and the book build then executes it itself.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest

from . import execution_cache

_SKIP_TAG = "skip-execution"
_runs: dict = {}  # notebook path -> {"nb", "cells", "passed", "started"}


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item, "test_outputs")


def _cache(config) -> Path:
    return Path(config.rootpath, execution_cache.DEFAULT)


def pytest_configure(config) -> None:
    nbval = config.getoption("nbval", False) or config.getoption("nbval_lax", False)
    if nbval and not hasattr(config, "workerinput"):  # once, in the controller
        inputs = execution_cache.configured_inputs(config.rootpath)
        digest = execution_cache.inputs_digest(config.rootpath, inputs)
        execution_cache.ensure_valid(_cache(config), digest)


def pytest_collection_modifyitems(session, config, items) -> None:
    for item in items:
        if _is_nbval_cell(item):
            run = _runs.setdefault(str(item.fspath), {"cells": 0, "passed": 0, "started": None})
            run["cells"] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _is_nbval_cell(item) or call.when != "call":
        return
    run = _runs.get(str(item.fspath))
    if run is None:
        return
    run["started"] = run["started"] or call.start
    report = outcome.get_result()
    if report.passed and item.test_outputs is not None:
        run["passed"] += 1
        item.cell.outputs = copy.deepcopy(item.test_outputs)
    elif report.skipped and _SKIP_TAG in item.cell.metadata.get("tags", []):
        run["passed"] += 1  # the book build skips it too (nbclient's skip tag): no outputs
        item.cell.outputs = []


def pytest_runtest_teardown(item, nextitem) -> None:
    if not _is_nbval_cell(item) or (nextitem is not None and nextitem.parent is item.parent):
        return
    run = _runs.pop(str(item.fspath), None)
    if run is None or run["passed"] != run["cells"]:
        return
    nb = copy.deepcopy(item.parent.nb)
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and _SKIP_TAG not in cell.metadata.get("tags", []):
            count += 1
            cell.execution_count = count
    execution_cache.add_executed(_cache(item.config), nb, Path(str(item.fspath)),
                                 time.time() - run["started"])
