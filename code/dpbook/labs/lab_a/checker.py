"""The checker of lab A: run a reader's DDP script with ``torchrun`` and judge it, item by item.

``check(script)`` runs the given single-process script once (the reference, cached per process)
and the reader's script under ``torchrun`` with ``nproc_per_node`` processes, each into its own
temporary directory, then checks: the run ends with exit code 0; only one rank logged; the
checkpoint exists, has no ``module.`` prefix and loads into a plain model; the data was split
between ranks (from the trace ``common.TracedDataset`` leaves); the order changed between epochs
(``set_epoch``); final weights and loss equal the reference within ``TOL``. It prints a report in
Vietnamese and returns a ``Result``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import torchrun, vi
from ...checks import int_at_least
from .. import preflight, report
from ..report import Item, Verdict
from . import GIVEN
from .common import NUM_SAMPLES, TRACE_ENV, build_model, read_traces

TOL = 1e-9  # float64 runs agree to ~1e-15; a wrong batch or order moves weights by ~1e-3
LOG_LINE = re.compile(r"^epoch \d+:", re.MULTILINE)
CKPT = "model.pt"


@dataclass(frozen=True)
class Result(Verdict):
    """The verdict on one script: ``passed`` if every item passed."""

    script: str
    nproc_per_node: int
    items: tuple[Item, ...]
    output: str
    max_weight_diff: float | None  # None: no comparable checkpoint
    loss: float | None  # the final loss the script saved

    def __str__(self) -> str:
        lines = self.report_lines(
            f"Kiểm tra {Path(self.script).name} (torchrun, {self.nproc_per_node} process):")
        if "exit" in self.failed:
            lines.append(_error_excerpt(self.output))
        return "\n".join(lines)


def _error_excerpt(output: str) -> str:
    """What the workers printed before torchrun's own report (its traceback and summary come
    last and only say that a child failed): the first worker traceback, else the last lines."""
    lines = output.strip().splitlines()
    agent = next((i for i, line in enumerate(lines) if line.startswith("Traceback")
                  and "torch/distributed/run.py" in "".join(lines[i:i + 4])), len(lines))
    workers = lines[:agent]
    start = next((i for i, line in enumerate(workers) if line.startswith("Traceback")), None)
    shown = workers[start:start + 25] if start is not None else workers[-20:]
    return "--- lỗi do các rank in ra ---\n" + "\n".join(shown)


@dataclass(frozen=True)
class Reference:
    """What the given single-process script produced."""

    state: dict
    loss: float
    output: str
    trace: list


@functools.lru_cache(maxsize=4)
def reference(epochs: int = 3, timeout: float = 120.0) -> Reference:
    """Run the given script once in a plain subprocess (cached: it is deterministic)."""
    out, trace = tempfile.mkdtemp(prefix="lab-a-ref-"), tempfile.mkdtemp(prefix="lab-a-trace-")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", **{TRACE_ENV: trace})
    try:
        # subprocess.run kills the child on timeout; the script starts no process of its own.
        proc = subprocess.run([sys.executable, str(GIVEN), "--out", out, "--epochs", str(epochs)],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode:
            raise RuntimeError(f"Script gốc lỗi (mã thoát {proc.returncode}):\n{proc.stderr}")
        ckpt = torch.load(Path(out) / CKPT, map_location="cpu")
        return Reference(ckpt["state"], ckpt["loss"], proc.stdout, read_traces(trace).get(0, []))
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"Script gốc chưa xong sau {vi.general(timeout)} s.") from None
    finally:
        shutil.rmtree(out, ignore_errors=True), shutil.rmtree(trace, ignore_errors=True)


def check_exit(returncode: int | None) -> Item:
    title = "Chạy xong, mọi rank thoát với mã 0"
    if returncode == 0:
        return Item("exit", title, True)
    seen = "quá thời gian, đã dừng mọi process" if returncode is None else f"mã thoát {returncode}"
    return Item("exit", title, False, seen,
                "đọc traceback ở cuối báo cáo. Hay gặp: quên init_process_group, chỉ rank 0 gọi "
                "dist.barrier() (các rank chờ nhau mãi), dùng cuda trên máy không có GPU.")


def check_log(output: str, epochs: int) -> Item:
    n = len(LOG_LINE.findall(output))
    detail = f"{n} dòng log 'epoch ...', mong đợi {epochs} (một dòng mỗi epoch)"
    if n < epochs:
        hint = "rank 0 in đúng một dòng `epoch E: ...` sau mỗi epoch, như script gốc."
    else:
        hint = ("bọc print trong `if rank == 0:`; mọi rank chạy cùng một mã nên không kiểm tra "
                "thì có N bản log.")
    return Item("log_once", "Chỉ một rank ghi log", n == epochs, detail, hint)


def check_checkpoint(path: Path) -> tuple[Item, dict | None, float | None]:
    """The checkpoint's item, and its weights and loss when they could be read."""
    title = "Checkpoint tồn tại, không có tiền tố `module.`, nạp được vào mô hình thường"
    if not path.exists():
        hint = ("sau vòng huấn luyện, rank 0 lưu vào os.path.join(args.out, 'model.pt') một dict "
                "có hai khóa như script gốc: trọng số và giá trị mất mát cuối.")
        return Item("checkpoint", title, False, f"không thấy {path.name} trong --out", hint), \
            None, None
    ckpt = torch.load(path, map_location="cpu")
    state, loss = ckpt.get("state"), ckpt.get("loss")
    prefixed = [k for k in state if k.startswith("module.")]
    if prefixed:
        return Item("checkpoint", title, False, f"{len(prefixed)}/{len(state)} khóa bắt đầu "
                    f"bằng 'module.' (ví dụ {prefixed[0]!r})",
                    "lưu model.module.state_dict(): DDP bọc mô hình gốc trong thuộc tính "
                    "module."), state, loss
    try:
        build_model().load_state_dict(state)
    except RuntimeError as exc:
        return Item("checkpoint", title, False, str(exc).splitlines()[0],
                    "lưu đúng state_dict của mô hình build_model()."), state, loss
    return Item("checkpoint", title, True, f"{len(state)} tensor"), state, loss


def check_split(traces: dict[int, list[int]], n: int, world: int, epochs: int) -> Item:
    """Every rank read ``n / world`` samples per epoch, and the ranks' parts of an epoch are
    disjoint and cover the data."""
    title, hint = "Dữ liệu được chia giữa các rank", (
        "dùng sampler = DistributedSampler(dataset, ...) và DataLoader(..., sampler=sampler); "
        "mỗi rank phải đọc một phần 1/N dữ liệu, không trùng nhau.")
    if sorted(traces) != list(range(world)):
        return Item("split", title, False, f"thấy các rank {sorted(traces)} đọc dữ liệu, mong "
                    f"đợi {list(range(world))}", hint)
    per_epoch = n // world
    for rank, seq in sorted(traces.items()):
        if len(seq) != epochs * per_epoch:
            return Item("split", title, False, f"rank {rank} đọc {len(seq)} mẫu trong {epochs} "
                        f"epoch, mong đợi {epochs} × {n}/{world} = {epochs * per_epoch}", hint)
    for e in range(epochs):
        parts = [set(traces[r][e * per_epoch:(e + 1) * per_epoch]) for r in range(world)]
        if set().union(*parts) != set(range(n)):
            return Item("split", title, False, f"epoch {e}: các rank đọc trùng mẫu", hint)
    return Item("split", title, True, f"mỗi rank đọc {per_epoch} mẫu mỗi epoch, không trùng nhau")


def check_set_epoch(traces: dict[int, list[int]], epochs: int) -> Item:
    """On every rank, the order of each epoch differs from the order of epoch 0."""
    title = "Thứ tự dữ liệu đổi theo epoch (set_epoch)"
    hint = "gọi sampler.set_epoch(epoch) ở đầu mỗi epoch, trước khi duyệt DataLoader."
    if not traces or any(len(s) == 0 or len(s) % epochs for s in traces.values()):
        return Item("set_epoch", title, False, "không tách được các epoch trong dữ liệu đã đọc",
                    hint)
    for rank, seq in sorted(traces.items()):
        m = len(seq) // epochs
        for e in range(1, epochs):
            if seq[e * m:(e + 1) * m] == seq[:m]:
                return Item("set_epoch", title, False,
                            f"rank {rank} đọc đúng cùng thứ tự ở epoch 0 và epoch {e}", hint)
    return Item("set_epoch", title, True, f"{epochs} epoch, {epochs} thứ tự khác nhau")


_NO_CHECKPOINT = "không có checkpoint để so", "sửa mục Checkpoint ở trên trước."


def _consequence(causes: tuple[Item, ...]) -> str | None:
    """The hint of an item that only fails because an earlier one did: the first failed item
    of ``causes`` is named, with its own hint. The final weights and loss differ whatever went
    wrong upstream, so their own hint would name a cause the evidence does not show."""
    cause = next((c for c in causes if not c.passed), None)
    return None if cause is None else f"hệ quả của mục ✗ “{cause.title}” ở trên: {cause.hint}"


def check_weights(state: dict | None, ref: dict, causes: tuple[Item, ...] = ()
                  ) -> tuple[Item, float | None]:
    """Final weights against the reference (a ``module.`` prefix is ignored here: the
    checkpoint item already reports it). ``causes``: the items on the data (split, order);
    when one failed, the hint names it instead of guessing."""
    title = "Trọng số cuối khớp bản một process"
    hint = _consequence(causes) or (
        "batch mỗi rank phải là BATCH_SIZE // world_size, giữ nguyên seed, optimizer, lr; mỗi "
        "rank một phần dữ liệu, thứ tự theo set_epoch.")
    if state is None:
        return Item("weights", title, False, *_NO_CHECKPOINT), None
    state = {k.removeprefix("module."): v for k, v in state.items()}
    if state.keys() != ref.keys():
        return Item("weights", title, False, "tên các tensor khác bản gốc", hint), None
    diff = max((state[k].double() - ref[k].double()).abs().max().item() for k in ref)
    detail = f"sai khác lớn nhất {vi.sci(diff, 1)} (ngưỡng {vi.sci(TOL, 0)})"
    return Item("weights", title, diff <= TOL, detail, hint), diff


def check_loss(loss: float | None, ref_loss: float, causes: tuple[Item, ...] = (),
               has_checkpoint: bool = True) -> Item:
    """The saved final loss against the reference. ``causes``: the items it follows from (data
    split, order, final weights): a loss computed from other weights differs however it was
    computed, so only when they all passed does the hint blame the computation itself."""
    title = "Giá trị mất mát cuối khớp bản một process"
    how = ("giá trị mất mát lưu trong checkpoint là evaluate(model.module, dataset) trên toàn bộ "
           "tập dữ liệu, tính trên rank 0 sau khi huấn luyện xong.")
    if not has_checkpoint:
        return Item("loss", title, False, *_NO_CHECKPOINT)
    if not isinstance(loss, float):
        return Item("loss", title, False,
                    f"checkpoint không có giá trị mất mát kiểu float ({loss!r})", how)
    ok = abs(loss - ref_loss) <= TOL * max(1.0, abs(ref_loss))
    hint = _consequence(causes) or f"trọng số đã khớp, vậy giá trị mất mát được tính khác: {how}"
    return Item("loss", title, ok, f"{vi.number(loss, 9)} so với {vi.number(ref_loss, 9)}", hint)


def judge(code: int | None, output: str, epochs: int, world: int, ckpt_item: Item,
          state: dict | None, loss, traces: dict[int, list[int]], ref: Reference
          ) -> tuple[tuple[Item, ...], float | None]:
    """The items of one run from what it left (pure: no process), and the largest weight
    difference. The weights and the loss are judged knowing the items on the data, so that
    their hints name the cause that the traces show."""
    data = (check_split(traces, NUM_SAMPLES, world, epochs), check_set_epoch(traces, epochs))
    weights, diff = check_weights(state, ref.state, data)
    return (check_exit(code), check_log(output, epochs), ckpt_item, *data, weights,
            check_loss(loss, ref.loss, (*data, weights), state is not None)), diff


def _run(script: Path, nproc: int, epochs: int, timeout: float, out: str, trace: str,
         backend: str = "auto"):
    """Run ``script`` under torchrun; returns (exit code or None on timeout, output)."""
    try:
        results = torchrun.run(str(script), ["--out", out, "--epochs", epochs], module=False,
                               nproc_per_node=nproc, timeout=timeout, check=False,
                               env={TRACE_ENV: trace}, backend=backend)
    except TimeoutError as exc:
        return None, str(exc)
    return results[0].returncode, results[0].output


def check(script: str | os.PathLike, nproc_per_node: int = 2, epochs: int = 3,
          timeout: float = 120.0, verbose: bool = True, backend: str = "auto") -> Result:
    """Run ``script`` with torchrun on ``nproc_per_node`` processes and judge it against the
    given single-process script; print the report if ``verbose``; return the ``Result``.
    ``backend="gloo"`` hides the GPUs from the script (``torchrun.BACKEND_ENV``), so a script
    that picks NCCL when it sees GPUs runs on the CPU."""
    int_at_least("nproc_per_node", nproc_per_node)
    int_at_least("epochs", epochs, 2)  # set_epoch shows only from the second epoch on
    script = preflight.source(script)
    ref = reference(epochs, timeout)
    out, trace = tempfile.mkdtemp(prefix="lab-a-out-"), tempfile.mkdtemp(prefix="lab-a-trace-")
    try:
        code, output = _run(script, nproc_per_node, epochs, timeout, out, trace, backend)
        ckpt_item, state, loss = check_checkpoint(Path(out) / CKPT)
        traces = read_traces(trace)
    finally:
        shutil.rmtree(out, ignore_errors=True), shutil.rmtree(trace, ignore_errors=True)
    items, diff = judge(code, output, epochs, nproc_per_node, ckpt_item, state, loss, traces,
                        ref)
    result = Result(str(script), nproc_per_node, items, output, diff,
                    loss if isinstance(loss, float) else None)
    if verbose:
        print(result)
    return result


def main(argv=None) -> int:
    """``python -m dpbook.labs.lab_a.checker FILE [--nproc N] [--timeout S]``."""
    return report.command_line(
        argv, "lab_a", "Chấm Bài A: chạy script DDP của bạn bằng torchrun và so với script một "
        "GPU.", "đường dẫn tới script DDP của bạn",
        lambda f, n, t: check(f, nproc_per_node=n, timeout=t), 300.0)


if __name__ == "__main__":
    raise SystemExit(main())
