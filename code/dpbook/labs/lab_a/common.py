"""What the lab's scripts share and the reader does not change: model, data, final evaluation.

Everything is float64 so that a DDP run (gradients averaged over ranks, then summed in another
order) agrees with the single-process run to ~1e-12 instead of ~1e-6.

The data set can leave a trace: when the environment variable ``DPBOOK_LAB_TRACE`` names a
directory, every sample index that a process reads is appended to a file named after the
process's ``RANK``. The checker reads these files to see how the data was split between ranks
and whether the order changed between epochs, without asking the reader's script to report it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ...data import synthetic_regression
from ...models import MLP, build_mlp

SEED = 0  # the shuffling seed; DistributedSampler's default seed is 0 too
NUM_SAMPLES = 64
BATCH_SIZE = 16  # the global batch: samples behind one optimizer step, over all ranks
LR = 0.01  # Adam
TRACE_ENV = "DPBOOK_LAB_TRACE"
MODEL_KWARGS = dict(in_dim=16, hidden=32, depth=3, out_dim=4)


def build_model() -> MLP:
    """The lab's MLP, same initial weights in every process, in float64."""
    return build_mlp(seed=0, **MODEL_KWARGS).to(torch.float64)


class TracedDataset(Dataset):
    """A tensor data set that records, per process, the index of every sample it serves."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y
        self._log = None  # opened on first read, only if tracing is on

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self._record(int(i))
        return self.x[i], self.y[i]

    def __getstate__(self):
        # DataLoader workers receive a pickled copy: each opens its own trace file.
        return {**self.__dict__, "_log": None}

    def _record(self, i: int) -> None:
        folder = os.environ.get(TRACE_ENV)
        if not folder:
            return
        if self._log is None:
            # RANK is set by torchrun; a plain single-process run counts as rank 0. The pid
            # keeps two processes that claim the same rank (a wrong launch) apart.
            name = f"rank{os.environ.get('RANK', '0')}-pid{os.getpid()}.txt"
            self._log = open(Path(folder) / name, "a", encoding="utf-8")
        # Flushed at once: the trace must survive a script that ends with os._exit or a crash.
        self._log.write(f"{i}\n")
        self._log.flush()


def make_dataset() -> TracedDataset:
    """The lab's regression data: ``NUM_SAMPLES`` samples, float64, the same in every process."""
    x, y = synthetic_regression(NUM_SAMPLES, MODEL_KWARGS["in_dim"], MODEL_KWARGS["out_dim"],
                                seed=1).tensors
    return TracedDataset(x.to(torch.float64), y.to(torch.float64))


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: TracedDataset) -> float:
    """Mean-squared error of ``model`` over the whole data set (read directly, not traced)."""
    dev = next(model.parameters()).device
    pred = model(dataset.x.to(dev))
    return torch.nn.functional.mse_loss(pred, dataset.y.to(dev)).item()


def read_traces(folder: str | os.PathLike) -> dict[int, list[int]]:
    """The indices each rank read, from the files ``TracedDataset`` wrote in ``folder``."""
    traces: dict[int, list[int]] = {}
    for path in sorted(Path(folder).glob("rank*-pid*.txt")):
        rank = int(path.name[4:path.name.index("-")])
        traces.setdefault(rank, []).extend(int(s) for s in path.read_text().split())
    return traces
