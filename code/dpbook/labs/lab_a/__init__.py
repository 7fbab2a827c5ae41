"""Lab A of section 4.2: turn a single-device training script into a DDP script.

``single_gpu.py`` is the given script, ``solution_ddp.py`` the converted one, ``broken_*.py``
conversions with one deliberate mistake each, ``common.py`` what every version shares (model,
data, final evaluation) and ``checker.py`` runs a reader's script under ``torchrun`` and compares
it with the single-process reference, check by check.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
GIVEN = HERE / "single_gpu.py"
SOLUTION = HERE / "solution_ddp.py"
BROKEN = {"no_sampler": HERE / "broken_no_sampler.py",
          "module_prefix": HERE / "broken_module_prefix.py"}
