"""What this machine has, probed once: CPU cores, memory, ``/dev/shm``, the torch build, each GPU,
NCCL, peer-to-peer access between GPUs, a Kaggle or Colab notebook.

``probe()`` returns a ``Machine`` (frozen dataclasses, plain data), which ``dpbook.doctor`` turns
into advice and ``make gpu-check`` prints; tests build a ``Machine`` by hand to stand for a
machine they do not have (a Kaggle 2×T4 notebook, a node of 8 GPUs). Probing never initialises
a CUDA context on a machine without a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..train import native_bf16

# Set in every Kaggle notebook and Colab runtime (what Kaggle's own ``kagglehub`` tests:
# ``kagglehub/env.py``, ``is_in_kaggle_notebook`` and ``is_in_colab_notebook``).
NOTEBOOK_VARS = (("KAGGLE_KERNEL_RUN_TYPE", "Kaggle"), ("COLAB_RELEASE_TAG", "Colab"))
CGROUP_MEMORY = ("/sys/fs/cgroup/memory.max",  # cgroup v2
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v1


@dataclass(frozen=True)
class Gpu:
    """One GPU as torch sees it; ``built_for``: the installed torch has code for its
    architecture (``sm_XY`` in ``torch.cuda.get_arch_list()``, or PTX it can compile from)."""

    index: int
    name: str
    capability: tuple[int, int]
    memory_bytes: int
    built_for: bool = True

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def native_bf16(self) -> bool:
        return native_bf16(self.capability)


@dataclass(frozen=True)
class Machine:
    """What the book's modes depend on. ``memory_bytes``: physical memory, or the container's
    limit where it is lower; ``shm_bytes``: the size of ``/dev/shm`` (``None``: none);
    ``nccl``: the NCCL version of the torch build (``None``: built without it); ``p2p``: for
    each ordered pair of GPUs, whether the first reaches the second's memory directly;
    ``notebook``: ``"Kaggle"``, ``"Colab"`` or ``None``."""

    cpu_cores: int
    memory_bytes: int | None
    shm_bytes: int | None
    torch_version: str
    cuda_version: str | None
    arch_list: tuple[str, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    nccl: str | None = None
    p2p: dict = field(default_factory=dict)
    notebook: str | None = None
    # What the NVIDIA driver lists (``nvidia-smi``), whether or not torch can use it: the GPUs'
    # names and the driver's version (``None``: no ``nvidia-smi`` on PATH, or it failed).
    system_gpus: tuple[str, ...] = ()
    driver: str | None = None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def unusable_gpus(self) -> bool:
        """The system shows NVIDIA GPUs but this torch sees none: a CPU-only build, or a CUDA
        build newer than the driver supports."""
        return bool(self.system_gpus) and not self.gpus

    def pairs_without_p2p(self) -> list[tuple[int, int]]:
        return sorted(pair for pair, ok in self.p2p.items() if not ok)


def cpu_cores() -> int:
    """The cores this process may run on (a container or ``taskset`` may allow fewer than the
    machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def memory_bytes() -> int | None:
    """Physical memory, or the cgroup limit of the container if it is lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = None
    for path in CGROUP_MEMORY:
        try:
            text = open(path, encoding="ascii").read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(int(text), total) if total else int(text)
        break
    return total


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory file system (Docker gives 64 MiB unless told otherwise)."""
    try:
        return shutil.disk_usage(path).total
    except OSError:
        return None


def nccl_version() -> str | None:
    """NCCL's version in this torch build (``2.27.3``), ``None`` for a build without it."""
    if not dist.is_nccl_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def built_for(capability: tuple[int, int], arch_list) -> bool:
    """Whether a torch built for ``arch_list`` runs on a GPU of ``capability``: its ``sm_XY`` is
    in the list, or PTX (``compute_XY``) for an equal or older architecture is."""
    major, minor = capability
    return f"sm_{major}{minor}" in arch_list or any(
        a.startswith("compute_") and int(a[8:]) <= major * 10 + minor for a in arch_list)


def gpus(arch_list=()) -> tuple[Gpu, ...]:
    if not torch.cuda.is_available():
        return ()
    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        capability = (props.major, props.minor)
        found.append(Gpu(i, props.name, capability, props.total_memory,
                         built_for(capability, arch_list)))
    return tuple(found)


def p2p(n: int) -> dict:
    """``{(i, j): bool}`` for every ordered pair of the first ``n`` GPUs."""
    return {(i, j): bool(torch.cuda.can_device_access_peer(i, j))
            for i in range(n) for j in range(n) if i != j}


def notebook(environ=None) -> str | None:
    environ = os.environ if environ is None else environ
    return next((name for var, name in NOTEBOOK_VARS if var in environ), None)


def nvidia_smi(timeout: float = 20.0) -> tuple[tuple[str, ...], str | None]:
    """``(GPU names, driver version)`` as the driver lists them, without torch: ``((), None)``
    when ``nvidia-smi`` is not on PATH or fails (no driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (), None
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=timeout, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return (), None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 2]
    return tuple(r[0] for r in rows), (rows[0][1] if rows else None)


def probe(environ=None) -> Machine:
    """This machine, now."""
    arch = tuple(torch.cuda.get_arch_list()) if torch.version.cuda else ()
    found = gpus(arch)
    names, driver = nvidia_smi()
    return Machine(cpu_cores(), memory_bytes(), shm_bytes(), torch.__version__,
                   torch.version.cuda, arch, found, nccl_version(), p2p(len(found)),
                   notebook(environ), names, driver)
