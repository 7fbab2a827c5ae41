"""Ranks that stay alive between notebook cells: the ``%ranks`` and ``%%ranks`` magics.

``launch.spawn`` starts fresh processes for every call and returns what a function returns;
here the ranks are long-lived ipyparallel engines, each one rank of a process group, that run
the learner's own code cell after cell and keep its variables::

    %load_ext dpbook.ranks
    %ranks start 2            # or %ranks start: one rank per GPU if there are >= 2, else 2 on CPU
    %%ranks
    t = torch.ones(2) * (dist.get_rank() + 1)
    %%ranks
    dist.all_reduce(t); print(t.tolist())
    %ranks stop

ipyparallel is the Jupyter project's engine for this (a controller and one engine process per
rank, talking over ZeroMQ); on a cluster its engines can be started by MPI or SLURM instead.
Used in 4.1.3 (a DDP iteration, one step per cell) and 4.2.1 (the collectives playground).

What the magics add to ipyparallel's own ``%%px``:

* the process group: every engine joins one with ``launch.join_group`` (gloo on CPU, NCCL with
  one engine per GPU), and finds ``torch``, ``dist``, ``rank``, ``world_size`` and ``device``
  defined;
* a deadline per cell: a rank stuck in a collective that a peer never called cannot be
  interrupted (it waits inside C++), so after the deadline, or after an error once the other
  ranks had time to finish, every rank is replaced by a fresh one (a group that lost a
  member cannot be mended), and the cell says the variables are gone;
* an interrupt (Jupyter's stop button) reaches the ranks as ``KeyboardInterrupt``;
* no process outlives the notebook: a small reaper process reads a pipe from the kernel and,
  when the kernel dies without ``%ranks stop`` (a crash, a kernel killed), ends the controller
  and every engine.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from . import launch, vi

DEFAULT_TIMEOUT_S = 60.0
NOT_STARTED = "Chưa có rank nào đang chạy: hãy gọi %ranks start trước (hoặc Ranks.start())."
_SETTLE_S = 5.0  # after a rank's error, how long the others get to finish on their own
_INTERRUPT_GRACE_S = 3.0  # after an interrupt, how long the ranks get to stop on their own
_START_TIMEOUT_S = 120  # engines registering with the controller, on a loaded machine
_POLL_S = 0.05
# Engines write the output of C++ code (NCCL, c10d) to their log, not to the cell: the log
# level of ipyparallel itself stays at errors, so the cell shows only the learner's output.
_LOG_LEVEL = logging.ERROR
# What every rank's namespace has before the learner's first cell.
# The controller registers an engine at its first heartbeat: at ipyparallel's default period
# (3 s) two engines took 6 s to come up here, at 0.5 s 2.5 s. The allowed misses grow to keep
# the default 30 s before a busy engine is declared dead.
_CONTROLLER_ARGS = ("--HeartMonitor.period=500", "--HeartMonitor.max_heartmonitor_misses=60")
_PRELUDE = """\
import torch
import torch.distributed as dist
from dpbook.launch import device as _dpbook_device
rank, world_size, device = dist.get_rank(), dist.get_world_size(), _dpbook_device()
del _dpbook_device
"""

# The reaper: reads process ids, one per line, from its standard input; when the input ends
# (the kernel closed it or died, which closes it too) it ends each of those process groups.
# "stop" before the end means a clean stop: the kernel has stopped the cluster itself.
_REAPER = r"""
import os, signal, sys, time
pids, clean = [], False
for line in sys.stdin:
    line = line.strip()
    if line == "stop":
        clean = True
    elif line:
        pids.append(int(line))
if not clean:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except OSError:
                pass
        time.sleep(1.0)
"""


class Reaper:
    """A small process that ends the process groups it is told about when this process dies
    without saying goodbye (a crash, a kernel killed): its standard input is a pipe from this
    process, and the operating system closes the pipe when this process ends, however it ends."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _REAPER], stdin=subprocess.PIPE,
                                      text=True, start_new_session=True)

    def watch(self, pids: list[int]) -> None:
        self._proc.stdin.write("".join(f"{p}\n" for p in pids))
        self._proc.stdin.flush()

    def release(self) -> None:
        """A clean stop: the caller has ended the processes itself."""
        self._proc.stdin.write("stop\n")
        self._proc.stdin.close()
        self._proc.wait(timeout=10)


def on_cpu(value):
    """``value`` with every tensor inside it (lists, tuples, dicts too) copied to the CPU."""
    from torch.utils._pytree import tree_map

    import torch

    return tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, value)


class RanksError(RuntimeError):
    """The learner's code failed on a rank, or the ranks did not finish in time. Jupyter shows
    only the message (the rank's own traceback included), not the magic's frames."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


@dataclass(frozen=True)
class RankOutput:
    """What one rank printed and returned for one cell."""

    rank: int
    stdout: str
    stderr: str
    result: str | None  # the value of the cell's last expression, as text
    error: str | None  # the rank's traceback


class Ranks:
    """A process group of long-lived ranks (one ipyparallel engine each)."""

    def __init__(self, world_size: int | None = None, backend: str = "auto"):
        self.plan = launch.plan(world_size, backend)
        self._cluster = self._client = self._view = self._reaper = None
        self._folder = None

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def running(self) -> bool:
        return self._view is not None

    def start(self, timeout: float = _START_TIMEOUT_S) -> None:
        import ipyparallel as ipp

        self._folder = tempfile.mkdtemp(prefix="dpbook-ranks-")
        self._reaper = Reaper()
        self._cluster = ipp.Cluster(n=self.world_size, log_level=_LOG_LEVEL,
                                    controller_args=list(_CONTROLLER_ARGS),
                                    engine_timeout=int(timeout), shutdown_atexit=True)
        try:
            self._cluster.start_cluster_sync()
            self._client = self._cluster.connect_client_sync()
            # interactive=False: no progress bar in the page while the engines register.
            self._client.wait_for_engines(self.world_size, timeout=timeout, interactive=False)
            self._reaper.watch(self.processes())
            ids = sorted(self._client.ids)[: self.world_size]
            store = os.path.join(self._folder, "store")
            joins = [self._client[e].apply_async(_join, r, self.world_size, self.plan.backend,
                                                 store, float(timeout))
                     for r, e in enumerate(ids)]
            for j in joins:
                j.get(timeout=timeout)
            self._view = self._client[ids]
            self._view.execute(_PRELUDE, block=True)
        except BaseException:
            self.stop()
            raise

    def _engine_pids(self) -> list[int]:
        return [e.process.pid for engine_set in self._cluster.engines.values()
                for e in engine_set.launchers.values()]

    def processes(self) -> list[int]:
        """Process ids of the controller and of every engine: what ``stop`` ends."""
        self._require_cluster()
        return [self._cluster.controller.process.pid] + self._engine_pids()

    def run(self, code: str, timeout: float = DEFAULT_TIMEOUT_S) -> list[RankOutput]:
        """Run ``code`` on every rank; each rank's output, in rank order. Raises ``RanksError``
        if a rank fails or the ranks have not all finished after ``timeout`` seconds (then every
        rank is replaced by a fresh one)."""
        self._require_running()
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout phải là số giây dương, nhận được {timeout!r}.")
        ar = self._view.execute(code, silent=False, block=False)
        try:
            stuck = self._wait(ar, timeout)
        except KeyboardInterrupt:
            self._interrupt(ar)
            raise
        outputs = _outputs(ar)
        failed = [o for o in outputs if o.error]
        if stuck:
            self._restart()
            raise RanksError(_stuck_message(outputs, failed, stuck, timeout))
        if failed:
            raise RanksError(_failure_message(failed[0], [o.rank for o in failed[1:]], outputs))
        return outputs

    def _wait(self, ar, timeout: float) -> list[int]:
        """Wait for the cell on every rank; the ranks still running when giving up."""
        deadline = time.monotonic() + timeout
        while True:
            done = [md["completed"] is not None for md in ar.metadata]
            if all(done):
                # A rank's reply can come before its printed output (two ZeroMQ channels):
                # wait for the output too, or a cell that printed would show nothing.
                ar.wait_for_output(max(1.0, deadline - time.monotonic()))
                return []
            errors = any(md["status"] == "error" for md in ar.metadata)
            if errors:
                deadline = min(deadline, time.monotonic() + _SETTLE_S)
            if time.monotonic() > deadline:
                return [r for r, d in enumerate(done) if not d]
            ar.wait(_POLL_S)

    def _interrupt(self, ar) -> None:
        """Jupyter's stop button: ``KeyboardInterrupt`` in every rank; if one cannot take it
        (it waits inside a collective), every rank is replaced."""
        self._cluster.signal_engines_sync(signal.SIGINT)
        ar.wait(_INTERRUPT_GRACE_S)
        if not ar.ready():
            print("Một số rank không dừng được (đang chờ trong một phép toán tập thể): "
                  "đã khởi động lại các rank; mọi biến cũ đã mất.", file=sys.stderr)
            self._restart()

    def _restart(self) -> None:
        self.stop(force=True)
        self.start()

    def pull(self, name: str) -> list:
        """The value of variable (or expression) ``name`` on every rank, in rank order (for the page's checks),
        with every tensor in it copied to the CPU on its rank first: under NCCL rank r's tensors
        sit on cuda:r, and the page's ``sum`` or ``torch.equal`` of two of them would mix
        devices (and unpickling them here would open a CUDA context in the kernel)."""
        self._require_running()
        try:
            compile(name, "<%ranks pull>", "eval")
        except SyntaxError:
            raise ValueError(f"Không lấy được {name!r}: cần một tên biến hoặc một biểu thức "
                             "Python, như t hoặc model.weight.grad.") from None
        self._view.execute(f"_dpbook_pulled = __import__('dpbook.ranks').ranks.on_cpu({name})",
                           block=True)
        return self._view.pull("_dpbook_pulled", block=True)

    def push(self, **values) -> None:
        """Set variables on every rank (the same value on each)."""
        self._require_running()
        self._view.push(values, block=True)

    def stop(self, force: bool = False) -> None:
        """Leave the group and end the controller and every engine. Idempotent. ``force``: the
        ranks may be stuck inside a collective, where no signal handler runs; kill them at once
        instead of asking (ipyparallel would wait 5 s after SIGTERM)."""
        view, self._view = self._view, None
        if view is not None and not force:
            try:
                view.apply_sync(_leave)
            except Exception:  # noqa: BLE001 - a broken group is ended with its processes
                pass
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._cluster is not None:
            if force:
                for pid in self._engine_pids():
                    _kill_group(pid)
            try:
                self._cluster.stop_cluster_sync()
            finally:
                self._cluster = None
        if self._reaper is not None:
            self._reaper.release()
            self._reaper = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _require_cluster(self) -> None:
        if self._cluster is None:
            raise RuntimeError(NOT_STARTED)

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError(NOT_STARTED)

    def describe(self) -> str:
        return (f"{self.plan.describe()} Các rank sống qua các ô mã (engine ipyparallel), "
                "mỗi ô %%ranks chạy trên mọi rank.")


def _join(rank: int, world_size: int, backend: str, store: str, timeout: float) -> int:
    """On an engine: join the group. ipyparallel sends this function by value (its code, not
    its module), so it imports what it uses."""
    import dpbook.launch

    dpbook.launch.join_group(rank, world_size, backend, store, timeout)
    return rank


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # ipyparallel starts each engine in its own session
    except OSError:
        pass


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _outputs(ar) -> list[RankOutput]:
    outputs = []
    for rank, md in enumerate(ar.metadata):
        result = md.get("execute_result") or {}
        error = md.get("error")
        outputs.append(RankOutput(
            rank=rank, stdout=md.get("stdout") or "", stderr=md.get("stderr") or "",
            result=(result.get("data") or {}).get("text/plain"),
            error=_traceback(error) if error is not None else None))
    return outputs


def _traceback(error) -> str:
    lines = getattr(error, "traceback", None) or ""
    text = lines if isinstance(lines, str) else "\n".join(lines)
    return text.rstrip() or f"{error.ename}: {error.evalue}"


def show(outputs: list[RankOutput], file=None) -> None:
    """Print each rank's output, every line labelled with its rank."""
    file = file or sys.stdout
    for o in outputs:
        for line in o.stdout.splitlines():
            print(f"[rank {o.rank}] {line}", file=file)
        for line in o.stderr.splitlines():
            print(f"[rank {o.rank}] {line}", file=sys.stderr)
        if o.result is not None:
            print(f"[rank {o.rank}] Out: {o.result}", file=file)


def _failure_message(first: RankOutput, others: list[int], outputs: list[RankOutput]) -> str:
    also = f" (rank {', '.join(map(str, others))} cũng gặp lỗi)" if others else ""
    printed = "".join(f"[rank {o.rank}] {line}\n" for o in outputs
                      for line in o.stdout.splitlines())
    return (f"{printed}Rank {first.rank} gặp lỗi{also}. Các biến trên mọi rank vẫn còn.\n"
            f"--- Traceback trong rank {first.rank} ---\n{first.error}")


def _stuck_message(outputs, failed, stuck: list[int], timeout: float) -> str:
    names = ", ".join(map(str, stuck))
    if failed:
        head = _failure_message(failed[0], [o.rank for o in failed[1:]], outputs)
        return (f"{head}\nRank {names} vẫn chờ (có lẽ trong một phép toán tập thể mà rank lỗi không "
                "gọi): đã khởi động lại mọi rank; các biến cũ đã mất, hãy chạy lại từ ô "
                "đầu tiên dùng %%ranks.")
    return (f"Quá thời gian chờ {vi.general(timeout)} s: rank {names} vẫn đang chạy (có thể "
            "đang chờ một phép toán tập thể mà rank khác không gọi). Đã khởi động lại mọi rank; các "
            "biến cũ đã mất, hãy chạy lại từ ô đầu tiên dùng %%ranks.")


# --- IPython magics -------------------------------------------------------------------------

_current: Ranks | None = None


def current() -> Ranks:
    """The ranks that ``%ranks start`` started in this kernel."""
    if _current is None or not _current.running:
        raise RuntimeError(NOT_STARTED)
    return _current


def start(world_size: int | None = None, backend: str = "auto") -> Ranks:
    """``%ranks start``: stop the ranks this kernel had, start new ones."""
    global _current
    ranks = Ranks(world_size, backend)  # bad arguments fail here, before the old ranks stop
    stop()
    ranks.start()
    _current = ranks
    return ranks


def stop() -> None:
    """``%ranks stop``."""
    global _current
    ranks, _current = _current, None
    if ranks is not None:
        ranks.stop()


_USAGE = ("Cách dùng: %ranks start [N] [--backend auto|gloo|nccl], %ranks stop, %ranks status, "
          "giá_trị = %ranks pull TÊN (biến TÊN của mọi rank, theo thứ tự rank); "
          "%%ranks [--timeout GIÂY] ở dòng đầu một ô mã.")


def _line_magic(line: str):
    words = line.split()
    if not words:
        raise RanksError(_USAGE)
    verb, rest = words[0], words[1:]
    if verb == "start":
        n, backend = _start_args(rest)
        ranks = start(n, backend)
        print(ranks.describe())
    elif verb == "stop":
        stop()
        print("Đã dừng mọi rank.")
    elif verb == "pull" and len(rest) == 1:
        return _running().pull(rest[0])
    elif verb == "status":
        print(current().describe() if _current is not None and _current.running
              else "Không có rank nào đang chạy.")
    else:
        raise RanksError(f"Lệnh %ranks không có '{verb}'. {_USAGE}")


def _start_args(words: list[str]) -> tuple[int | None, str]:
    n, backend = None, "auto"
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--backend" and i + 1 < len(words):
            backend, i = words[i + 1], i + 2
        elif w.isdigit() and n is None:
            n, i = int(w), i + 1
        else:
            raise RanksError(f"Không hiểu '{w}'. {_USAGE}")
    try:
        launch.plan(n, backend)  # the Python API's ValueError, as one line before anything stops
    except ValueError as exc:
        raise RanksError(f"%ranks start {' '.join(words)}: {exc}") from None
    return n, backend


def _running() -> Ranks:
    """``current()`` for the magics: not started is the learner's slip, one line, no
    traceback."""
    try:
        return current()
    except RuntimeError as exc:
        raise RanksError(str(exc)) from None


def _cell_magic(line: str, cell: str) -> None:
    words = line.split()
    timeout = DEFAULT_TIMEOUT_S
    if words[:1] == ["--timeout"] and len(words) == 2:
        try:
            timeout = float(words[1])
        except ValueError:
            raise RanksError(f"--timeout cần một số giây, nhận được '{words[1]}'.") from None
    elif words:
        raise RanksError(f"Không hiểu '{line.strip()}'. {_USAGE}")
    show(_running().run(cell, timeout=timeout))


def load_ipython_extension(ipython) -> None:
    """``%load_ext dpbook.ranks``."""
    ipython.register_magic_function(_line_magic, "line", "ranks")
    ipython.register_magic_function(_cell_magic, "cell", "ranks")


def unload_ipython_extension(ipython) -> None:
    stop()
