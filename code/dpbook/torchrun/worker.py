"""What every torchrun worker of the book does first: read the variables ``torchrun`` set, find
which ranks share this machine, pick the backend and the GPU, and join the process group
(``init_from_env``). Every torchrun script of the package (``dpbook.scripts``) starts here, and a
reader's own script can too.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import socket
import time

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from .. import vi
from ..launch import BACKENDS as LAUNCH_BACKENDS, pick_backend
from ..launch import INIT_BARRIER, device, leave_groups
from . import BACKEND_VAR

# Variables torchrun sets in every worker; integers first, then strings.
INT_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING")
STR_VARS = ("MASTER_ADDR", "ROLE_NAME", "TORCHELASTIC_RUN_ID")
REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def read_env(environ: dict | None = None) -> dict:
    """The torchrun variables of ``environ`` (default: this process), integers parsed.

    Raises ``RuntimeError`` when a variable every launcher must set is missing: the script was
    then started with plain ``python`` instead of ``torchrun``.
    """
    environ = os.environ if environ is None else environ
    missing = [k for k in REQUIRED if k not in environ]
    if missing:
        raise RuntimeError(f"Thiếu biến môi trường {missing}: hãy khởi động bằng torchrun "
                           "(torchrun --nproc_per_node=N -m ...), không phải bằng python.")
    env = {k: int(environ[k]) for k in INT_VARS if k in environ}
    env.update({k: environ[k] for k in STR_VARS if k in environ})
    return env


SAME_HOST_VAR = "DPBOOK_SAME_HOST"  # "1": every agent runs on this host (emulated nodes)
# Accepted values of BACKEND_VAR (torchrun.run(backend=...) sets it): launch's, less "auto".
BACKENDS = tuple(b for b in LAUNCH_BACKENDS if b != "auto")


def host_id() -> str:
    """What identifies this machine to its peers: the kernel's boot id, shared by every process
    (containers included) that sees the same GPUs, and unique per machine even where cloned
    machines share a hostname; the hostname where ``/proc`` does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def ranks_on_this_host(store, rank: int, world_size: int, me: str | None = None) -> list[int]:
    """The global ranks of the job that run on this machine, in order, learnt through ``store``
    (each worker publishes its ``host_id`` and reads everyone's). More ranks here than
    ``LOCAL_WORLD_SIZE`` means several agents share the machine."""
    me = host_id() if me is None else me
    store.set(f"dpbook_host/{rank}", me)
    keys = [f"dpbook_host/{r}" for r in range(world_size)]
    store.wait(keys)
    return [r for r, k in enumerate(keys) if store.get(k).decode() == me]


def choose_backend(environ: dict, gpus: int,
                   host_ranks: list[int] | None = None) -> tuple[str, int | None]:
    """``(backend, cuda index)`` for the worker described by ``environ`` on a host with
    ``gpus`` GPUs: NCCL with one GPU per worker when there are enough, else gloo on the CPU.

    On a real node a worker owns ``cuda:LOCAL_RANK`` and the node needs ``LOCAL_WORLD_SIZE``
    GPUs. When several agents share one host to emulate nodes (``host_ranks``, the ranks found on
    this host, holds more than this agent's workers; or ``DPBOOK_SAME_HOST=1``), two workers with
    the same ``LOCAL_RANK`` would collide on one GPU, so each owns the GPU of its position among
    the host's ranks and the host needs one GPU per rank it runs. ``DPBOOK_BACKEND`` forces the
    backend: ``gloo`` always works, ``nccl`` without enough GPUs is refused."""
    env = read_env(environ)
    if environ.get(SAME_HOST_VAR) == "1":
        host_ranks = list(range(env["WORLD_SIZE"]))
    if host_ranks is None or len(host_ranks) <= env["LOCAL_WORLD_SIZE"]:
        needed, index = env["LOCAL_WORLD_SIZE"], env["LOCAL_RANK"]
    else:
        needed, index = len(host_ranks), host_ranks.index(env["RANK"])
    forced = environ.get(BACKEND_VAR, "")
    if forced and forced not in BACKENDS:
        raise ValueError(f"{BACKEND_VAR}={forced!r} không hợp lệ: chỉ nhận {' hoặc '.join(BACKENDS)} "
                         "(hoặc bỏ trống để tự chọn theo số GPU).")
    backend = pick_backend(forced or "auto", gpus, needed, asked=f"{BACKEND_VAR}=nccl",
                           fix=f"Bỏ {BACKEND_VAR} để chạy gloo trên CPU, hoặc giảm --nproc_per_node.")
    return backend, (index if backend == "nccl" else None)


_SEEN: dict = {}  # what init_from_env learnt about this process (host_ranks_seen)

# Test only: seconds after which the process group and the store give up (the book's tests set
# it so that a hang fails in seconds). Unset, PyTorch's defaults apply: 30 min for gloo, 10 min
# for NCCL (torch/distributed/constants.py, distributed_c10d._get_default_timeout).
TIMEOUT_VAR = "DPBOOK_TEST_PG_TIMEOUT_S"


def test_timeout(environ: dict | None = None) -> datetime.timedelta | None:
    """The timeout ``TIMEOUT_VAR`` asks for (tests only), or ``None``: PyTorch's default."""
    environ = os.environ if environ is None else environ
    raw = environ.get(TIMEOUT_VAR, "")
    if not raw:
        return None
    seconds = float(raw)
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_VAR}={raw!r}: cần một số giây dương.")
    return datetime.timedelta(seconds=seconds)


def agree_on_start(store, rank: int, world_size: int,
                   timeout: datetime.timedelta, poll_s: float = 0.02) -> str:
    """A key prefix that every worker of this start of the group gets, and that no earlier
    start used: rank 0 draws it at random and hands it to each rank in answer to a nonce that
    rank drew, so a key left by a previous start can never be mistaken for this one's.

    torchrun's agents share one TCPStore for the whole job (``dynamic_rendezvous.py``,
    ``next_rendezvous``: the shared store server is created once, at the first round, and
    every restart gets the same ``MASTER_ADDR:MASTER_PORT``), so a restarted group finds there
    every key the previous start wrote. Nothing in the workers' environment tells two starts
    apart on every node: ``TORCHELASTIC_RESTART_COUNT`` is kept per agent and rises only on the
    agent whose own workers failed (``elastic/agent/server/api.py``, ``_invoke_run``), the
    rendezvous round is not passed to the workers, and ``TORCHELASTIC_RUN_ID`` is the same for
    the whole job."""
    deadline = time.monotonic() + timeout.total_seconds()
    if rank != 0:
        nonce = secrets.token_hex(8)
        store.set(f"dpbook_join/{rank}", nonce)
        store.wait([f"dpbook_ack/{nonce}"], timeout)
        prefix = store.get(f"dpbook_ack/{nonce}").decode()
        store.set(f"{prefix}/dpbook_joined/{rank}", "1")
        return prefix
    prefix = f"dpbook_start_{secrets.token_hex(8)}"
    acked: dict[int, bytes] = {}
    waiting = set(range(1, world_size))
    while waiting:
        for r in sorted(waiting):
            if store.check([f"{prefix}/dpbook_joined/{r}"]):
                waiting.discard(r)
            elif store.check([f"dpbook_join/{r}"]):
                nonce = store.get(f"dpbook_join/{r}")
                if acked.get(r) != nonce:  # an old nonce gets an answer nobody reads
                    store.set(f"dpbook_ack/{nonce.decode()}", prefix)
                    acked[r] = nonce
        if waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Rank 0: sau {vi.general(timeout.total_seconds())} s vẫn chưa thấy "
                                   f"rank {sorted(waiting)} của lần khởi động này.")
            time.sleep(poll_s)
    return prefix


def init_from_env() -> torch.device:
    """Join the process group described by torchrun's variables with the backend
    ``choose_backend`` picks, and return this worker's device (``launch.device()``).

    Under torchrun's shared agent store (``TORCHELASTIC_USE_AGENT_STORE=True``, the default),
    that store lives as long as the job, so a restarted group finds the keys the previous start
    left there (gloo's peer addresses, the init barrier's counter). The workers therefore first
    agree on a prefix of their own for this start (``agree_on_start``: rank 0 draws it, every
    node gets the same one) and use the store only under it. The same store tells each worker
    which ranks share its machine, before any GPU is chosen. Timeouts are PyTorch's (30 min
    gloo, 10 min NCCL) unless a test sets ``TIMEOUT_VAR``.
    """
    # A script started by the reader's own torchrun gets the init barrier too (dpbook.launch).
    os.environ.update(INIT_BARRIER)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    timeout = test_timeout()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        backend, index = choose_backend(dict(os.environ), gpus)
        if index is not None:
            torch.cuda.set_device(index)  # before init: NCCL binds this process to it
        dist.init_process_group(backend=backend, timeout=timeout)  # env://: a fresh store
        return device()
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                is_master=False, timeout=timeout or default_pg_timeout)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    prefix = agree_on_start(agent_store, rank, world_size, timeout or default_pg_timeout)
    store = dist.PrefixStore(prefix, agent_store)
    host_ranks = ranks_on_this_host(store, rank, world_size)
    _SEEN["host_ranks"] = host_ranks
    backend, index = choose_backend(dict(os.environ), gpus, host_ranks)
    if index is not None:
        torch.cuda.set_device(index)
    kwargs = {"device_id": torch.device("cuda", index)} if index is not None else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timeout, **kwargs)
    return device()


def host_ranks_seen() -> list[int] | None:
    """The ranks ``init_from_env`` found on this machine (``None`` without the agent's store)."""
    return _SEEN.get("host_ranks")


@contextlib.contextmanager
def process_group():
    """``with process_group() as dev:``: join the group torchrun describes (``init_from_env``)
    for the block, and always leave it, also when the block raises. A worker that exits without
    leaving warns and, under NCCL, may not release its communicators; after a failure under NCCL
    the group is aborted rather than destroyed, since destroying waits for peers that may be
    stuck in a collective (as ``launch.spawn``'s ranks do, ``launch.leave_groups``)."""
    dev = init_from_env()
    backend = dist.get_backend()
    failed = True
    try:
        yield dev
        failed = False
    finally:
        leave_groups(backend, failed)
