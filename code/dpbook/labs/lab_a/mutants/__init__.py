"""Wrong conversions of lab A ("mutants"), one mistake each: the checker must fail each on the
items of ``MUTANTS[name].items`` (exactly those), with ``hint`` in the hint of the first one.

Each file's docstring says what is wrong and which item must catch it; ``tests/labs/
test_mutants.py`` runs the checker on all of them (``broken_*.py`` of the lab are included).
Not caught, by design (the lab page says so): a script that saves the checkpoint on every rank
(the same bytes, written twice) or whose log shows rank 0's share of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAB = HERE.parent


@dataclass(frozen=True)
class Mutant:
    path: Path
    items: tuple[str, ...]  # the items that must fail, in report order
    hint: str  # a phrase of the first item's hint that names the cause


MUTANTS = {
    "no_sampler": Mutant(LAB / "broken_no_sampler.py", ("split", "weights", "loss"),
                         "DistributedSampler"),
    "module_prefix": Mutant(LAB / "broken_module_prefix.py", ("checkpoint",), "model.module.state_dict()"),
    "no_set_epoch": Mutant(HERE / "no_set_epoch.py", ("set_epoch", "weights", "loss"),
                           "sampler.set_epoch(epoch)"),
    "log_every_rank": Mutant(HERE / "log_every_rank.py", ("log_once",), "if rank == 0"),
    "full_batch_per_rank": Mutant(HERE / "full_batch_per_rank.py", ("weights", "loss"),
                                  "BATCH_SIZE // world_size"),
    "loss_on_shard": Mutant(HERE / "loss_on_shard.py", ("loss",), "evaluate(model.module, dataset)"),
}
