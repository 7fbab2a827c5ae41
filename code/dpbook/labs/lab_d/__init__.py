"""Lab D of section 4.2: write DDP yourself, a ring AllReduce and gradient buckets.

The learner's file defines ``ring_all_reduce(tensor)`` and ``class MyDDP``. ``starter.py`` is
where the learner starts (signatures, docstrings, TODOs), ``solution.py`` the reference,
``broken_*.py`` versions with one deliberate mistake each, ``common.py`` the model and data the
checker trains, and ``checker.py`` runs a file on 2 ranks and judges it check by check.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
STARTER = HERE / "starter.py"
SOLUTION = HERE / "solution.py"
BROKEN = {"ring_divisible": HERE / "broken_ring_divisible.py",
          "all_at_end": HERE / "broken_all_at_end.py"}
NAMES = ("ring_all_reduce", "MyDDP")  # what the learner's file must define


def load(path: str | os.PathLike) -> ModuleType:
    """Import the learner's file ``path`` as a module (a fresh one at every call), so that
    ``load("my_ddp.py").MyDDP`` is the learner's class."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ValueError(f"Không thấy file {str(path)!r}: cần đường dẫn tới file .py của bạn.")
    spec = importlib.util.spec_from_file_location(f"lab_d_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
