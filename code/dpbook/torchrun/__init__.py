"""Run ``torchrun`` from a notebook or a test: one agent per emulated node, with a timeout.

``torchrun`` is how training is launched outside a notebook: one *agent* per node starts the
node's worker processes, sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... for
them, and restarts them (``--max_restarts``) when one fails. This module builds the command
line, starts the agents as subprocesses (several agents on one machine emulate several nodes,
meeting through a c10d rendezvous on a free local port), waits with a deadline and, whatever
happens, leaves no process behind: torchrun puts each worker in its own session, so on a
timeout the whole process tree of every agent is killed, not only the agents.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import vi
from ..checks import int_at_least, non_negative, one_of
from ..launch import INIT_BARRIER

_GRACE_S = 5.0  # after SIGTERM, torchrun needs a moment to stop its workers itself
BACKEND_VAR = "DPBOOK_BACKEND"  # read by torchrun.worker.choose_backend in every worker
# What ``backend=`` puts in the workers' environment. Forcing gloo also hides the GPUs, so a
# worker that picks its backend itself (a learner's script) picks gloo too, and touches no GPU.
BACKEND_ENV = {"auto": {}, "gloo": {BACKEND_VAR: "gloo", "CUDA_VISIBLE_DEVICES": ""},
               "nccl": {BACKEND_VAR: "nccl"}}


@dataclass(frozen=True)
class AgentResult:
    """What one agent (one emulated node) printed and how it ended."""

    node_rank: int
    command: tuple[str, ...]
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def free_port() -> int:
    """A TCP port that is free right now on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(target: str, args=(), *, nproc_per_node: int = 2, nnodes: int = 1,
            node_rank: int = 0, rdzv_endpoint: str | None = None, max_restarts: int = 0,
            module: bool = True, rdzv_id: str = "dpbook") -> list[str]:
    """The ``torchrun`` command line for one agent.

    ``target`` is a module name (``module=True``, as ``python -m``) or a script path. One node
    uses ``--standalone`` (a private rendezvous on a free port); several nodes meet at
    ``rdzv_endpoint`` (``host:port``) through the c10d rendezvous backend.
    """
    int_at_least("nproc_per_node", nproc_per_node)
    int_at_least("nnodes", nnodes)
    non_negative("max_restarts", max_restarts)
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank phải trong [0, {nnodes - 1}], nhận được {node_rank}.")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ValueError("Chạy nhiều node cần rdzv_endpoint dạng 'host:port'.")
        # With the c10d rendezvous the agents agree on node ranks themselves (torchrun ignores
        # --node_rank then, with a warning), so it is not passed.
        cmd += [f"--nnodes={nnodes}", "--rdzv_backend=c10d",
                f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={rdzv_id}"]
    cmd.append(f"--max_restarts={max_restarts}")
    if module:
        cmd.append("-m")
    return cmd + [str(target)] + [str(a) for a in args]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children first found, deepest last."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM the agent (torchrun then stops its workers), then SIGKILL whatever is left."""
    tree = _descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    for pid in [proc.pid] + tree + _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


# A caller that is itself a rank (a test inside spawn, a notebook started by torchrun) must not
# leak its identity into the ranks it starts.
_IDENTITY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
             "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")


def _env(extra: dict | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _IDENTITY}
    # One thread per worker: on a small machine N workers x all cores oversubscribe the CPU.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(INIT_BARRIER)  # no gloo worker leaves while a peer is still connecting
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def display(cmd) -> str:
    """``cmd`` as a reader would type it: ``torchrun ...`` instead of ``python -m
    torch.distributed.run ...``."""
    cmd = [str(c) for c in cmd]
    if cmd[1:3] == ["-m", "torch.distributed.run"]:
        cmd = ["torchrun"] + cmd[3:]
    return " ".join(cmd)


def run_process(cmd, timeout: float = 120.0, env: dict | None = None,
                cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run one command (a torchrun agent, ``python -m ...``) with stdout and stderr merged into
    ``stdout``; after ``timeout`` seconds kill its whole process tree and raise ``TimeoutError``."""
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout phải là số giây dương, nhận được {timeout!r}.")
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(env),
                                cwd=cwd)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            raise TimeoutError(f"Lệnh chạy quá {vi.general(timeout)} s và đã bị dừng (cùng mọi "
                               f"process con): {display(cmd)}\n{_read(log)[-2000:]}") from None
        return subprocess.CompletedProcess(cmd, proc.returncode, _read(log), None)


def run(target: str, args=(), *, nproc_per_node: int = 2, nnodes: int = 1,
        max_restarts: int = 0, timeout: float = 120.0, module: bool = True,
        env: dict | None = None, cwd: str | None = None, check: bool = True,
        backend: str = "auto", during=None) -> list[AgentResult]:
    """Start ``nnodes`` torchrun agents (``nproc_per_node`` workers each) on this machine, wait
    for all of them and return one ``AgentResult`` per agent, in node order.

    ``backend="auto"`` lets each worker choose (``torchrun.worker.choose_backend``: NCCL when the
    host has a GPU per worker); ``"gloo"`` or ``"nccl"`` forces it (``BACKEND_ENV``).

    ``check=True`` raises ``RuntimeError`` (with every agent's output) if an agent fails.
    After ``timeout`` seconds every agent and worker is killed and ``TimeoutError`` is raised.
    ``during``, if given, is called about every 0.1 s while the agents run, with their
    ``subprocess.Popen`` objects (a test injects faults from there).
    """
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout phải là số giây dương, nhận được {timeout!r}.")
    one_of("backend", backend, tuple(BACKEND_ENV))
    env = {**BACKEND_ENV[backend], **(env or {})}
    endpoint = None if nnodes == 1 else f"127.0.0.1:{free_port()}"
    cmds = [command(target, args, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=i,
                    rdzv_endpoint=endpoint, max_restarts=max_restarts, module=module)
            for i in range(nnodes)]
    logs = [tempfile.TemporaryFile(mode="w+", encoding="utf-8") for _ in cmds]
    procs: list[subprocess.Popen] = []
    try:
        for cmd, log in zip(cmds, logs):
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          env=_env(env), cwd=cwd))
        _wait_all(procs, timeout, logs, during)
        results = [AgentResult(i, tuple(c), p.returncode, _read(log))
                   for i, (c, p, log) in enumerate(zip(cmds, procs, logs))]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_tree(p)
        for log in logs:
            log.close()
    if check and not all(r.ok for r in results):
        bad = [r for r in results if not r.ok]
        detail = "\n".join(f"--- node {r.node_rank} (mã thoát {r.returncode}) ---\n{r.output}"
                           for r in bad)
        raise RuntimeError(f"torchrun thất bại ở node {[r.node_rank for r in bad]}:\n{detail}")
    return results


def run_parallel(cmds, timeout: float = 120.0, env: dict | None = None,
                 cwd: str | None = None, during=None) -> list[AgentResult]:
    """Start every command of ``cmds`` at once (the same ``torchrun`` line typed on each node of
    an emulated cluster), wait for all and return one ``AgentResult`` each, in order; after
    ``timeout`` seconds kill every process tree and raise ``TimeoutError``. No check: the
    caller reads ``returncode``. ``during``: as in ``run``."""
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout phải là số giây dương, nhận được {timeout!r}.")
    cmds = [[str(c) for c in cmd] for cmd in cmds]
    logs = [tempfile.TemporaryFile(mode="w+", encoding="utf-8") for _ in cmds]
    procs: list[subprocess.Popen] = []
    try:
        for cmd, log in zip(cmds, logs):
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          env=_env(env), cwd=cwd))
        _wait_all(procs, timeout, logs, during)
        return [AgentResult(i, tuple(c), p.returncode, _read(log))
                for i, (c, p, log) in enumerate(zip(cmds, procs, logs))]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_tree(p)
        for log in logs:
            log.close()


def emit(tag: str, record: dict) -> None:
    """Print ``<tag> <record as JSON>`` as one line in a single write; ``json_records`` reads it
    back. torchrun starts workers unbuffered (``python -u``), where ``print`` writes each argument
    and the newline separately, so the lines of workers sharing one output interleave mid-line."""
    sys.stdout.write(f"{tag} {json.dumps(record, sort_keys=True)}\n")
    sys.stdout.flush()


def json_records(results: list[AgentResult], tag: str) -> list[dict]:
    """The JSON objects that workers printed as ``<tag> {...}`` lines, in output order, each
    with an ``agent`` key: the index of the agent (emulated node) whose output it came from.
    Other lines (torchrun's own warnings, progress) are skipped."""
    records = []
    for r in results:
        for line in r.output.splitlines():
            if line.startswith(tag + " "):
                records.append({**json.loads(line[len(tag) + 1:]), "agent": r.node_rank})
    return records


def _read(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()


def _wait_all(procs: list[subprocess.Popen], timeout: float, logs, during=None) -> None:
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        if during is not None:
            during(procs)
        if time.monotonic() > deadline:
            for p in procs:
                _kill_tree(p)
            outputs = "\n".join(f"--- node {i} ---\n{_read(log)[-2000:]}"
                                for i, log in enumerate(logs))
            raise TimeoutError(f"torchrun chưa xong sau {vi.general(timeout)} s: đã dừng mọi "
                               f"agent và worker.\n{outputs}")
        time.sleep(0.1)
