"""Start ``world_size`` ranks from a notebook or a script and bring their results back.

``spawn(fn, *args, world_size=None, backend="auto", timeout=120.0, output="prefix")`` runs
``fn(rank, world_size, *args, **kwargs)`` in fresh processes (forked from a forkserver, see below),
each with its process group already initialised, and returns the per-rank return values in rank order.

Design choices, and why:

* Ranks are forked from a *forkserver* that has already imported torch (start method
  ``forkserver``; ``spawn`` where the platform has none). A warm launch then costs a fork and a
  gloo handshake (about 0.2 s) instead of two fresh interpreters importing torch (about 2 s).
  The forkserver imports torch but never touches CUDA, so each rank still picks its own GPU.
  It is started with the caller's environment; each launch sends the caller's current
  ``os.environ`` along, so a variable set in a cell (``NCCL_DEBUG``...) reaches the ranks.
* Rendezvous goes through a ``FileStore`` in a fresh temporary folder per launch: no port at
  all, so concurrent launches (tests in parallel, two notebooks) never collide, and no socket
  for the store. A ``TCPStore`` formats every peer address with ``getnameinfo``; for the
  IPv4-mapped ``::ffff:127.0.0.1`` that its IPv6-first client uses, that is a reverse DNS query,
  and on a machine whose DNS server is unreachable or drops a packet, a launch stalls 5 s (the
  resolver's timeout; 12 of 300 connections here). ``GLOO_SOCKET_IFNAME=lo`` (unless the caller
  set it) puts gloo's own sockets on the loopback interface without resolving the host name.
* ``TORCH_DIST_INIT_BARRIER=1`` in every rank: ``init_process_group`` and ``new_group`` then end
  with a store barrier. Without it a gloo rank that leaves right after ``init_process_group``
  closes its sockets while a slower peer is still inside ``connectFullMesh``; the peer then
  fails with ``Connection closed by peer`` (gloo's connecting side counts the pair as connected
  once it has written its sequence number, before the other side has accepted). See
  ``benchmarks/gloo_init_race.py``: 44 and 50 of 100 launches failed without the barrier in two
  runs, 0 with it.
* The function goes to the ranks by name when they can import it by name (a function at the
  top level of a module: what ``pickle`` does, and the fast path). A function they cannot import
  that way (defined in a notebook cell, a lambda, a nested function), or arguments that refer to
  such things, goes *by value*: the caller serialises it with ``cloudpickle`` (its code, the
  globals and closure variables it reads), the way Ray and ipyparallel ship notebook code, and
  each rank loads it back. What cannot be serialised (a lock, an open file) is refused in the
  caller, before any process starts, with a message naming the variable.
* Results travel as ``pickle.dumps`` bytes rather than through ``torch.multiprocessing``'s
  shared-memory reducers: a rank may exit right after sending, and shared-memory handles of a
  dead process are not reliably readable by the parent.
* The caller polls its children with a deadline, so a rank that raises or hangs is reported
  and every child is terminated (SIGTERM, then SIGKILL). A rank also watches its caller (the
  parent sentinel that multiprocessing gives it) and kills itself when the caller dies, so no
  orphan survives a crashed notebook; the forkserver itself exits with its caller.
* Children's ``print`` output is forwarded line by line to the caller, which prints it: in
  Jupyter it then lands in the cell that launched the run, prefixed with the rank.
"""

from __future__ import annotations

import ast
import datetime
import gc
import multiprocessing.connection
import os
import pickle
import queue as queue_mod
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import vi
from .checks import int_at_least, one_of

BACKENDS = ("auto", "gloo", "nccl")
OUTPUTS = ("prefix", "rank0", "none")
_GRACE_S = 3.0  # how long a terminated child gets before SIGKILL
_POLL_S = 0.05
_OUTLIVE_S = 30.0  # how much longer than the caller's deadline a rank's own timeouts are
_NATIVE_LINES = 20  # how much of a failed rank's C++-level output its RankError carries
_SETTLE_S = 5.0  # after a first error, time allowed for the other ranks' reports (a loaded
# machine can take seconds to deliver them; ranks that exit end the wait sooner)
# What the forkserver imports once, so that no rank pays for it: torch and the parts of
# torch.distributed that the book's rank functions import lazily (about 1 s more each).
# torch._dynamo too: the first dispatch through any TorchDispatchMode (``measure.CommLog``, the
# CPU peak tracker) imports it with sympy, 822 modules; preloaded, a 2-rank launch of
# ``measure.measure_step`` took 0.27 s instead of 1.3 s here, for 1.4 s more once per forkserver.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.distributed.fsdp",
           "torch.distributed.tensor", "torch.distributed.checkpoint", "torch._dynamo",
           "dpbook.launch", "dpbook.workers", "cloudpickle")
# Set in every process that joins a group, here and under torchrun (see the module docstring).
INIT_BARRIER = {"TORCH_DIST_INIT_BARRIER": "1"}
RANK_NAME = "dpbook-rank"  # process name of every rank (``ps``, ``psutil``), then its number
# "1": a gloo rank that has initialised CUDA fails (``make gpu-check``'s fallback runs: on a GPU
# box each CPU rank that touches CUDA opens a context on GPU 0 and may hide a wrong device).
NO_CUDA_VAR = "DPBOOK_CHECK_NO_CUDA"


class RankError(RuntimeError):
    """A rank raised an exception; ``rank``, ``exc_type`` and ``remote_traceback`` tell which.

    ``native_output`` holds the last lines that rank wrote below Python (C++ code writing to
    file descriptor 2: NCCL's watchdog, c10d's warnings, a fatal signal's report), which no
    ``print`` forwarding sees; empty when it wrote none."""

    def __init__(self, rank: int, exc_type: str, message: str, remote_traceback: str,
                 native_output: str = ""):
        self.rank = rank
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        self.native_output = native_output
        native = (f"\n--- Rank {rank} ghi ở tầng C++ (stderr của process) ---\n{native_output}"
                  if native_output else "")
        super().__init__(
            f"Rank {rank} gặp lỗi {exc_type}: {message}\n"
            f"--- Traceback trong rank {rank} ---\n{remote_traceback.rstrip()}{native}"
        )


@dataclass(frozen=True)
class Plan:
    """What ``spawn`` will do: the backend, the device type and the number of ranks."""

    backend: str
    device_type: str
    world_size: int
    gpus_found: int

    def describe(self) -> str:
        """One Vietnamese sentence a page can print to say which mode it runs in."""
        if self.backend == "nccl":
            return (
                f"Chế độ GPU: backend NCCL, {self.world_size} process, mỗi process một GPU "
                f"(cuda:0 … cuda:{self.world_size - 1}; máy có {self.gpus_found} GPU)."
            )
        reason = (
            "máy không có GPU"
            if self.gpus_found == 0
            else f"máy chỉ có {self.gpus_found} GPU, không đủ cho {self.world_size} process"
        )
        return f"Chế độ CPU: backend gloo, {self.world_size} process trên CPU ({reason})."


def plan(world_size: int | None = None, backend: str = "auto", gpus: int | None = None) -> Plan:
    """Resolve ``world_size=None`` and ``backend="auto"`` against the GPUs of this machine (or
    against ``gpus`` GPUs: what another machine would do, ``dpbook.doctor``'s question)."""
    one_of("backend", backend, BACKENDS)
    if gpus is None:
        # a build without NCCL has no GPU backend, whatever the GPUs (review D22; doctor's rule)
        gpus = torch.cuda.device_count() if torch.cuda.is_available() \
            and dist.is_nccl_available() else 0
    if world_size is None:
        world_size = gpus if gpus >= 2 else 2
    int_at_least("world_size", world_size)
    backend = pick_backend(backend, gpus, world_size, asked="backend='nccl'",
                           fix="Hãy giảm world_size hoặc dùng backend='gloo' (CPU).")
    return Plan(backend, "cuda" if backend == "nccl" else "cpu", world_size, gpus)


def pick_backend(requested: str, gpus: int, needed: int, asked: str, fix: str) -> str:
    """The book's one rule for a backend, under ``spawn`` and under torchrun: NCCL when this host
    has a GPU for each of the ``needed`` ranks it runs, else gloo on the CPU. ``requested`` may
    force either; ``nccl`` without the GPUs is refused with ``asked`` (how it was requested) and
    ``fix`` (what to do instead) in the message."""
    one_of("backend", requested, BACKENDS)
    if requested == "nccl" and gpus < needed:
        raise ValueError(f"{asked} cần một GPU cho mỗi rank trên máy này: cần {needed} GPU nhưng "
                         f"chỉ thấy {gpus}. {fix}")
    if requested == "auto":
        return "nccl" if gpus >= needed else "gloo"
    return requested


def describe_mode(world_size: int | None = None, backend: str = "auto") -> str:
    """Shortcut for ``plan(world_size, backend).describe()``."""
    return plan(world_size, backend).describe()


def device() -> torch.device:
    """The device of the calling rank: ``cuda:<local rank>`` under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_MAIN_MODULES = (None, "__main__", "__mp_main__")


def _name_problem(obj) -> str | None:
    """Why a process that imports modules by name could not find ``obj`` (a function or a
    class) again, or ``None`` if it could."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", getattr(obj, "__name__", "?"))
    if module in _MAIN_MODULES:
        return "được định nghĩa trong notebook hoặc trong script đang chạy (module __main__)"
    if "<lambda>" in qualname or "<locals>" in qualname:
        return "là lambda hoặc hàm lồng trong hàm khác"
    try:
        found = sys.modules.get(module) or __import__(module, fromlist=["_"])
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - any failure means the child cannot import it either
        return f"không tìm lại được qua đường dẫn import {module}.{qualname}"
    return None if found is obj else f"tên {module}.{qualname} chỉ tới một đối tượng khác"


def importable(fn: Callable) -> bool:
    """Whether child processes can import ``fn`` by its module and qualified name (what
    ``pickle`` sends for a function), so that ``spawn`` may send only the name."""
    return _name_problem(fn) is None


def check_importable(fn: Callable) -> None:
    """Refuse a function that child processes could not import by name. ``spawn`` does not
    need this (it sends such a function by value); ``torch.multiprocessing.spawn`` does."""
    if not callable(fn):
        raise TypeError(f"fn phải là một hàm, nhận được {type(fn).__name__}.")
    why = _name_problem(fn)
    if why is not None:
        qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", "?"))
        raise ValueError(
            f"Hàm {qualname!r} không import lại được theo tên: hàm này {why}. pickle chỉ ghi "
            "tên module và tên hàm, nên một process con nhận hàm qua pickle (như với "
            "torch.multiprocessing.spawn) không tìm lại được nó. launch.spawn gửi hàm như vậy "
            "theo giá trị (cloudpickle); với torch.multiprocessing.spawn, hãy đặt hàm ở cấp cao "
            "nhất của một module import được (một file .py cạnh notebook) rồi import nó.")


def _goes_by_name(obj) -> bool:
    """Whether ``pickle`` can send ``obj`` so that a child finds it again: a function or class
    by its name, another object through its class. Only the top level is looked at (cheap);
    what hides deeper fails in the rank and is reported from there."""
    if callable(obj) and hasattr(obj, "__qualname__"):
        return importable(obj)
    cls = type(obj)
    return cls.__module__ == "builtins" or importable(cls)


class _ByValue:
    """A rank function and its arguments serialised by value with cloudpickle in the caller;
    a rank loads them back with ``load`` (plain ``pickle`` reads cloudpickle's output)."""

    def __init__(self, blob: bytes):
        self.blob = blob

    def load(self) -> tuple:
        return pickle.loads(self.blob)


def pack(fn: Callable, args: tuple, kwargs: dict) -> tuple:
    """What the ranks receive, as ``(fn, args, kwargs)``: unchanged when every part goes by
    name, else one ``_ByValue`` holding all three. Raises ``ValueError`` (in the caller, before
    any process starts) for what cannot be serialised."""
    if not callable(fn):
        raise TypeError(f"fn phải là một hàm, nhận được {type(fn).__name__}.")
    if importable(fn) and all(map(_goes_by_name, (*args, *kwargs.values()))):
        return fn, args, kwargs
    return _ByValue(by_value(fn, args, kwargs)), (), {}


def by_value(fn: Callable, args: tuple = (), kwargs: dict | None = None) -> bytes:
    """``(fn, args, kwargs)`` serialised with cloudpickle: a function that no child can import
    goes with its code and the globals and closure variables it reads."""
    import cloudpickle

    kwargs = kwargs or {}
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - which object failed is found below
        raise ValueError(_unserialisable_message(fn, args, kwargs, exc)) from exc


def _global_names(code) -> set[str]:
    """The global names a code object reads, nested functions and comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _global_names(const)
    return names


def _parts(fn: Callable, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """``(what, object)`` for everything ``by_value`` serialises along with ``fn``."""
    parts = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                parts.append((f"biến {name!r} mà hàm giữ trong closure", cell.cell_contents))
            except ValueError:  # a cell not filled yet
                pass
        scope = getattr(fn, "__globals__", {})
        parts += [(f"biến toàn cục {name!r} mà hàm dùng", scope[name])
                  for name in sorted(_global_names(code)) if name in scope]
    parts += [(f"đối số vị trí thứ {i + 1} sau (rank, world_size)", a) for i, a in enumerate(args)]
    parts += [(f"đối số {k!r}", v) for k, v in kwargs.items()]
    return parts


def _unserialisable_message(fn: Callable, args: tuple, kwargs: dict, exc: Exception) -> str:
    import cloudpickle

    qualname = getattr(fn, "__qualname__", type(fn).__name__)
    what = f"một đối tượng mà hàm dùng tới ({type(exc).__name__}: {exc})"
    for label, obj in _parts(fn, args, kwargs):
        try:
            cloudpickle.dumps(obj)
        except Exception as part_exc:  # noqa: BLE001
            what = f"{label} (kiểu {type(obj).__name__}: {part_exc})"
            break
    return (
        f"Không gửi được hàm {qualname!r} sang các process con: {what} không tuần tự hóa được. "
        "launch.spawn gửi cho mỗi rank hàm cùng các đối số; thứ mà process con không import "
        "lại được theo tên (hàm định nghĩa trong notebook, lambda, hàm lồng) được gửi theo giá "
        "trị bằng cloudpickle, kèm mã và các biến mà nó dùng. Khóa (lock), file đang mở, socket, luồng (thread) hay process chỉ có nghĩa "
        "trong process đã tạo ra chúng, nên không sao chép sang process khác được. Cách sửa: "
        "tạo đối tượng ấy bên trong hàm, để mỗi rank tự tạo bản của mình (mở file theo đường "
        "dẫn, tạo khóa mới), hoặc truyền thứ đủ để tạo lại nó (một đường dẫn, một con số) làm "
        "đối số. Chưa process nào được khởi động."
    )


class _Forward:
    """A text stream that sends each complete line to the caller through the queue."""

    def __init__(self, q, rank: int, stream: str):
        self._q, self._rank, self._stream, self._buf = q, rank, stream, ""

    def write(self, text: str) -> int:
        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            self._q.put(("out", self._rank, self._stream, line))
        return len(text)

    def flush(self) -> None:
        if self._buf:
            self._q.put(("out", self._rank, self._stream, self._buf))
            self._buf = ""

    def isatty(self) -> bool:
        return False


def _prctl(option: int, arg) -> None:
    """Linux ``prctl``; a no-op where there is none."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg)
    except OSError:
        pass


def _guard_against_orphans() -> None:
    """Die with the caller. Under forkserver the OS parent is the forkserver, so
    ``PR_SET_PDEATHSIG`` alone only covers the forkserver's death; the parent sentinel that
    multiprocessing hands every child becomes readable when the caller itself is gone."""
    _prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    parent = mp.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="dpbook-watch-caller", daemon=True).start()


def _is_secondary(exc: BaseException) -> bool:
    """A communication error caused by another rank going away, not a root cause: what c10d
    raises (``DistError`` and its subclasses, NCCL's ``DistBackendError`` among them) or gloo's
    transport reports. Mentioning NCCL is not enough: a rank's own error may name it too."""
    return isinstance(exc, dist.DistError) or "gloo/transport" in str(exc)


def _report_error(q, rank: int, exc: BaseException) -> None:
    sys.stdout.flush(), sys.stderr.flush()
    q.put(("error", rank, type(exc).__name__, str(exc), traceback.format_exc(),
           time.time(), _is_secondary(exc)))


def _native_log(store_path: str, rank: int) -> str:
    return os.path.join(os.path.dirname(store_path), f"rank{rank}.native.log")


def _capture_native_output(path: str) -> None:
    """Send this process's file descriptors 1 and 2 to ``path``. C++ code (NCCL's watchdog
    before it aborts the process, c10d's warnings) writes there directly, past ``sys.stderr``;
    in Jupyter that output would land in the server's terminal, not in the cell."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _abort_groups() -> None:
    """Under NCCL, tear the groups down without a collective: ``destroy_process_group`` waits
    on its peers' communicators, which a failed run has left mid-collective (torch's
    ``_abort_process_group``, experimental in 2.13, aborts every communicator locally)."""
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception:  # noqa: BLE001 - the process is ending anyway
        pass


def _bound_device(backend: str, rank: int) -> dict:
    """``init_process_group``'s ``device_id`` under NCCL: the group is bound to the rank's GPU,
    so ``barrier()`` and ``new_group()`` need not guess it (torch warns at every barrier then)."""
    return {"device_id": torch.device("cuda", rank)} if backend == "nccl" else {}


def leave_groups(backend: str, failed: bool) -> None:
    """End of a rank: destroy its groups, or abort them under NCCL after a failure (torchrun's
    workers end the same way: ``torchrun.worker.process_group``)."""
    if failed and backend == "nccl":
        _abort_groups()
    else:
        dist.destroy_process_group()


def join_group(rank: int, world_size: int, backend: str, store_path: str, timeout: float) -> None:
    """Make this process rank ``rank`` of a new default group: the environment torchrun would
    set, the rank's GPU (NCCL) or its share of the CPU threads (gloo), and rendezvous on the
    ``FileStore`` at ``store_path``. ``spawn``'s ranks and ``%ranks``' engines both join this way."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), **INIT_BARRIER)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        # Ranks share the CPU: without this each would start one thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    wait = datetime.timedelta(seconds=timeout)
    store = dist.FileStore(store_path, world_size)
    store.set_timeout(wait)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=wait, **_bound_device(backend, rank))


def _child(rank, world_size, backend, store_path, timeout, output, q, env, fn, args, kwargs):
    # What the rank inherits from the forkserver (torch and the preloaded modules, about 290 000
    # objects) is never garbage: frozen, the collector stops walking it, and each gc.collect()
    # that frees FSDP's reference cycles between runs (labs B, C, E) costs next to nothing
    # instead of 0.16 s (0.4 s with 4 ranks on 2 cores), without touching, hence copying, the
    # pages shared with the forkserver.
    gc.freeze()
    _guard_against_orphans()
    _capture_native_output(_native_log(store_path, rank))
    _prctl(15, f"{RANK_NAME}{rank}".encode())  # 15 = PR_SET_NAME: ranks are easy to find
    q.put(("started", rank))
    forward = output == "prefix" or (output == "rank0" and rank == 0)
    if forward:
        sys.stdout, sys.stderr = _Forward(q, rank, "stdout"), _Forward(q, rank, "stderr")
    else:
        sys.stdout = sys.stderr = open(os.devnull, "w")
    os.environ.clear()
    os.environ.update(env)
    try:
        if isinstance(fn, _ByValue):
            fn, args, kwargs = fn.load()
        # Longer than the caller's deadline, so that a hang ends in the caller's TimeoutError
        # (which names the stuck ranks), not in a rank's own collective timeout.
        join_group(rank, world_size, backend, store_path, timeout + _OUTLIVE_S)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        _report_error(q, rank, exc)
        return
    failed = True
    try:
        result = fn(rank, world_size, *args, **kwargs)
        if backend == "gloo" and env.get(NO_CUDA_VAR) == "1" and torch.cuda.is_initialized():
            raise RuntimeError(f"rank {rank} chạy gloo trên CPU nhưng đã khởi tạo CUDA "
                               f"({NO_CUDA_VAR}=1): một hàm đã gọi torch.cuda hay đặt tensor lên "
                               "GPU dù thiết bị của rank là CPU.")
        payload = pickle.dumps(result)
        failed = False
    except BaseException as exc:  # noqa: BLE001
        # Report before tearing down the group: peers blocked in a collective fail right after,
        # and the caller uses the time stamps to tell the cause from its consequences.
        _report_error(q, rank, exc)
        return
    finally:
        leave_groups(backend, failed)
    sys.stdout.flush(), sys.stderr.flush()
    q.put(("result", rank, payload))


def context():
    """The multiprocessing context of every launch: forkserver with torch preloaded (spawn
    where the platform has no forkserver). Starting the forkserver costs one torch import
    (about 3 s, once per process); every later launch forks from it. Setting the same preload
    list again is harmless, so concurrent launches need no lock."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _main_module_call_line() -> tuple[str, int] | None:
    """Where the running script's top level is now (file, line), if a script is running."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py"):
        return None  # Jupyter, python -c, the REPL: nothing is re-imported
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if name == "__main__" or name.endswith(".__main__"):
        return None  # python -m package: multiprocessing does not re-import a __main__ module
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return str(path), frame.f_lineno
        frame = frame.f_back
    return None


def _is_main_guard(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare)
            and "__name__" in ast.unparse(test) and "__main__" in ast.unparse(test))


def check_main_guard() -> None:
    """Refuse a launch from the top level of a script that lacks ``if __name__ == "__main__":``.

    Start methods forkserver and spawn re-import the script in every child; an unguarded
    call there would launch again from each child (multiprocessing then stops the child
    with an error the caller never sees)."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(_GUARD_MESSAGE.format(where="script này"))
    where = _main_module_call_line()
    if where is None:
        return
    path, line = where
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        return
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            if not _is_main_guard(node):
                raise RuntimeError(_GUARD_MESSAGE.format(where=f"{path}, dòng {line}"))
            return


_GUARD_MESSAGE = (
    "launch.spawn được gọi ở cấp cao nhất của {where}, ngoài khối "
    "`if __name__ == \"__main__\":`. Mỗi process con (start method forkserver hoặc spawn) "
    "import lại script chính từ đầu, nên lời gọi này sẽ chạy lại trong từng process con và "
    "process con dừng với lỗi trước khi kịp chạy hàm của bạn. Cách sửa: đặt lời gọi (và mọi "
    "code chỉ chạy một lần) dưới `if __name__ == \"__main__\":`, ví dụ\n"
    "    if __name__ == \"__main__\":\n        launch.spawn(worker, world_size=2)"
)


def _terminate(procs) -> None:
    """SIGTERM every live child, SIGKILL those still alive after a grace period, reap all."""
    procs = [p for p in procs if p.pid is not None]  # a start may have failed midway
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


def _print_line(rank: int, stream: str, line: str, prefix: bool) -> None:
    out = sys.stderr if stream == "stderr" else sys.stdout
    print(f"[rank {rank}] {line}" if prefix else line, file=out, flush=True)


def spawn(fn: Callable, *args: Any, world_size: int | None = None, backend: str = "auto",
          timeout: float = 120.0, output: str = "prefix", **kwargs: Any) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks; return their results.

    ``fn`` may be any function, one defined in a notebook cell included: what the ranks cannot
    import by name goes by value (``pack``). ``output``: ``"prefix"`` prints every rank's output, other ranks' lines prefixed with
    ``[rank r]`` (rank 0's lines appear as they are); ``"rank0"`` prints only rank 0's output;
    ``"none"`` prints nothing. Raises ``RankError`` if a rank fails, ``TimeoutError`` if the
    ranks have not all finished after ``timeout`` seconds; in both cases no child survives.
    """
    one_of("output", output, OUTPUTS)
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout phải là số giây dương, nhận được {timeout!r}.")
    fn, args, kwargs = pack(fn, args, kwargs)
    check_main_guard()
    p = plan(world_size, backend)
    n = p.world_size
    rendezvous = tempfile.mkdtemp(prefix="dpbook-launch-")
    ctx = context()
    q = ctx.Queue()
    env = dict(os.environ)
    store = os.path.join(rendezvous, "store")

    def processes(payload):
        return [ctx.Process(target=_child, daemon=True, name=f"{RANK_NAME}{r}",
                            args=(r, n, p.backend, store, timeout, output, q, env, *payload))
                for r in range(n)]

    procs = processes((fn, args, kwargs))
    try:
        try:
            procs[0].start()  # pickles the payload before forking: a failure starts nothing
        except (TypeError, AttributeError, pickle.PicklingError):
            if isinstance(fn, _ByValue):
                raise
            # pickle refused an argument (a lambda inside a dict...): send all of it by value
            procs = processes((_ByValue(by_value(fn, args, kwargs)), (), {}))
            procs[0].start()
        for proc in procs[1:]:
            proc.start()
        logs = [_native_log(store, r) for r in range(n)]
        return _collect(procs, q, n, timeout, output, logs)
    finally:
        _terminate(procs)
        q.close()
        q.join_thread()
        shutil.rmtree(rendezvous, ignore_errors=True)


@dataclass
class _Reports:
    """What the ranks have sent so far."""

    results: dict
    errors: list
    started: set

    def reported(self, rank: int) -> bool:
        return rank in self.results or any(e[0] == rank for e in self.errors)


def _collect(procs, q, n, timeout, output, logs) -> list:
    seen = _Reports({}, [], set())
    deadline = time.monotonic() + timeout
    settle = None  # after a first error, how long to wait for the others' reports
    while len(seen.results) + len(seen.errors) < n:
        if seen.errors and settle is None:
            settle = time.monotonic() + _SETTLE_S
        if settle is not None and time.monotonic() > settle:
            break
        try:
            msg = q.get(timeout=_POLL_S)
        except queue_mod.Empty:
            _check_exits(procs, seen, q, output)
            if not seen.errors and time.monotonic() > deadline:
                running = sorted(r for r in range(n) if r not in seen.results)
                raise TimeoutError(
                    f"Quá thời gian chờ {vi.general(timeout)} s: rank "
                    f"{', '.join(map(str, running))} vẫn "
                    "đang chạy (có thể đang chờ một phép toán tập thể mà rank khác không gọi). "
                    "Các process đã bị dừng; hãy kiểm tra mọi rank có gọi cùng chuỗi collective "
                    "không."
                ) from None
            continue
        _handle(msg, seen, output)
    if seen.errors:
        _check_exits(procs, seen, q, output)  # a rank the watchdog just aborted
        raise _root_cause(seen.errors, logs)
    return [seen.results[r] for r in range(n)]


def _root_cause(errors: list[tuple], logs: list[str] | None = None) -> RankError:
    """The error that is not a consequence of another: a non-communication error first, then
    the earliest."""
    rank, exc_type, message, tb, _, _ = min(errors, key=lambda e: (e[5], e[4]))
    others = sorted({e[0] for e in errors} - {rank})
    if others:
        message += f" (sau đó rank {', '.join(map(str, others))} cũng dừng vì lỗi này)"
    native = _tail(logs[rank]) if logs else ""
    return RankError(rank, exc_type, message, tb, native)


# NCCL's watchdog names the timeout in one line; stack dumps written after it (the flight
# recorder's, C++ frames) can push it out of the last lines (gpu-path review, D19).
_ROOT_CAUSE_LINE = "Watchdog caught"


def _tail(path: str, lines: int = _NATIVE_LINES) -> str:
    """The last ``lines`` lines a rank wrote below Python, and before them the watchdog's line
    if it fell outside."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().rstrip().splitlines()
    except OSError:
        return ""
    tail = text[-lines:]
    cause = next((line for line in text[:-lines] if _ROOT_CAUSE_LINE in line), None)
    return "\n".join(([cause, "…"] if cause else []) + tail)


def _handle(msg, seen: _Reports, output) -> None:
    kind, rank = msg[0], msg[1]
    if kind == "out":
        _print_line(rank, msg[2], msg[3], prefix=(output == "prefix" and rank != 0))
    elif kind == "started":
        seen.started.add(rank)
    elif kind == "result":
        seen.results[rank] = pickle.loads(msg[2])
    else:
        seen.errors.append((rank, *msg[2:]))


def _check_exits(procs, seen: _Reports, q, output) -> None:
    """A child that died without reporting (segfault, os._exit, OOM kill) is an error too."""
    for rank, proc in enumerate(procs):
        if seen.reported(rank) or proc.exitcode is None:
            continue
        # It may have reported just before exiting: drain what it sent first.
        try:
            while True:
                _handle(q.get(timeout=0.5), seen, output)
        except queue_mod.Empty:
            pass
        if not seen.reported(rank):
            seen.errors.append(_silent_exit(rank, proc.exitcode, rank in seen.started))


def _silent_exit(rank: int, code: int, started: bool) -> tuple:
    how = f"tín hiệu {signal.Signals(-code).name}" if code < 0 else f"mã thoát {code}"
    if started:
        return (rank, "ProcessExited",
                f"process của rank {rank} kết thúc ({how}) mà không trả kết quả",
                "(không có traceback: process đã chết trước khi kịp báo lỗi)", time.time(), False)
    return (rank, "ProcessExited",
            f"process của rank {rank} dừng ({how}) ngay khi khởi động, trước khi chạy hàm: "
            "process con không nạp lại được script chính hoặc module chứa hàm (xem stderr của "
            "terminal). Hay gặp nhất: script gọi launch.spawn mà không đặt dưới "
            "`if __name__ == \"__main__\":`.",
            "(không có traceback: lỗi xảy ra khi process con nạp lại module)", time.time(), False)
