"""``python -m dpbook.doctor``: what this machine can run, and which mode each part of the book
takes here, with what to change; two tables in Vietnamese.

The facts come from ``tools.machine.probe()``; the modes from the rules the book itself runs
(``launch.plan`` and ``launch.pick_backend``, ``train.native_bf16``), asked about this machine's
GPU count instead of being written a second time. ``report(machine)`` works on any ``Machine``,
so the tests show what a Kaggle 2×T4 notebook or a Colab session would print.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass

from .. import launch, vi
from .machine import Machine, probe

# PyTorch's own CI gives its Docker containers 2 GB of /dev/shm so that NCCL does not crash in
# ``ncclShmOpen`` (pytorch/tutorials, commit 0ba3e39); Docker's default is 64 MiB.
SHM_ADVISED = 2 * 2**30
SHM_MINIMUM = 2**30
KAGGLE_2GPU = "notebook Kaggle với Accelerator “GPU T4 x2”"
WIDTHS = (30, 30, 40)  # the columns of the modes table, in characters
# The oldest Linux driver each CUDA major version runs on (NVIDIA, CUDA Toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions", https://docs.nvidia.com/cuda/archive/13.0.0/
# cuda-toolkit-release-notes/index.html: CUDA 13.x needs >= 580; CUDA 12.x, with minor version
# compatibility, >= 525). PyPI's torch wheel for Linux is a CUDA 13 build since torch 2.11.
MIN_DRIVER = {13: 580, 12: 525}
OLD_DRIVER_BUILD = "cu126"  # PyTorch's CUDA 12.6 build, from its own index (Makefile: TORCH=)


def unusable_gpus_advice(m: Machine) -> str | None:
    """What to install when the driver shows GPUs that this torch cannot use (``None``: not the
    case). The driver's version decides which CUDA build it runs."""
    if not m.unusable_gpus:
        return None
    names = ", ".join(m.system_gpus)
    driver = m.driver or "không rõ"
    seen = f"nvidia-smi thấy {len(m.system_gpus)} GPU ({names}; driver {driver})"
    try:
        major = int(driver.split(".")[0])
    except ValueError:
        major = None
    if m.cuda_version is None:
        return (f"{seen}, nhưng bản torch {m.torch_version} chỉ chạy trên CPU. Cài bản có CUDA: "
                f"make setup TORCH={OLD_DRIVER_BUILD}" + (
                    "" if major is None or major < MIN_DRIVER[13]
                    else " (hoặc để trống TORCH: bản CUDA 13 của PyPI, driver này chạy được)")
                + ".")
    cuda_major = int(m.cuda_version.split(".")[0])
    needed = MIN_DRIVER.get(cuda_major)
    if major is not None and needed is not None and major < needed:
        if major < MIN_DRIVER[12]:
            return (f"{seen}, nhưng bản torch này dùng CUDA {m.cuda_version}, cần driver ≥ "
                    f"{needed}; driver {driver} cũ hơn cả CUDA 12 (≥ {MIN_DRIVER[12]}): hãy nâng "
                    "driver NVIDIA.")
        return (f"{seen}, nhưng bản torch này dùng CUDA {m.cuda_version}, cần driver ≥ {needed}. "
                f"Cài bản CUDA 12.6 cho driver cũ hơn: make setup TORCH={OLD_DRIVER_BUILD}.")
    return (f"{seen}, nhưng torch (CUDA {m.cuda_version}) không dùng được GPU nào: xem "
            "python -c \"import torch; torch.cuda.init()\" để biết lỗi của CUDA.")


@dataclass(frozen=True)
class Row:
    """One part of the book: the mode it takes on this machine, and what to change (empty:
    nothing)."""

    part: str
    mode: str
    advice: str = ""


def gib(n: int | None) -> str:
    return "không rõ" if n is None else f"{vi.number(n / 2**30, 1)} GiB"


def facts(m: Machine) -> list[tuple[str, str]]:
    """The first table: ``(what, on this machine)``."""
    cuda = f"CUDA {m.cuda_version}" if m.cuda_version else "không có CUDA (bản chỉ cho CPU)"
    rows = [("Nhân CPU dùng được", str(m.cpu_cores)), ("Bộ nhớ", gib(m.memory_bytes)),
            ("/dev/shm", gib(m.shm_bytes) if m.shm_bytes is not None else "không có"),
            ("PyTorch", f"{m.torch_version}, {cuda}")]
    if not m.gpus:
        rows.append(("GPU", "KHÔNG DÙNG ĐƯỢC: " + unusable_gpus_advice(m) if m.unusable_gpus
                     else "không có"))
    for g in m.gpus:
        built = "" if g.built_for else f", bản torch này KHÔNG có mã cho {g.sm}"
        rows.append((f"GPU cuda:{g.index}", f"{g.name}, {g.sm}, {gib(g.memory_bytes)}, bf16 gốc: "
                     f"{'có' if g.native_bf16 else 'không'}{built}"))
    rows.append(("NCCL", m.nccl or "không có trong bản torch này"))
    if m.gpu_count < 2:
        p2p = "không áp dụng (cần từ 2 GPU)"
    elif not m.pairs_without_p2p():
        p2p = "có, giữa mọi cặp GPU"
    else:
        p2p = "không có giữa " + ", ".join(f"{i}→{j}" for i, j in m.pairs_without_p2p())
    rows.append(("P2P giữa các GPU", p2p))
    rows.append(("Notebook đám mây", m.notebook or "không phát hiện (không phải Kaggle hay Colab)"))
    return rows


def _mode(p: launch.Plan, who: str = "process") -> str:
    if p.backend == "nccl":
        return f"NCCL, {p.world_size} {who}, mỗi {who} một GPU"
    return f"gloo, {p.world_size} {who} trên CPU"


def _usable_gpus(m: Machine) -> int:
    """The GPUs NCCL can use: none when the build lacks NCCL or code for one of them."""
    if m.nccl is None or not all(g.built_for for g in m.gpus):
        return 0
    return m.gpu_count


def _more_gpus(m: Machine, needed: int) -> str:
    """What to do when the ranks outnumber the GPUs."""
    if m.gpus and _usable_gpus(m) == 0:
        if m.nccl is None:
            return "Bản torch này không có NCCL: cài bản PyTorch có CUDA (make setup trên Linux)."
        bad = ", ".join(g.sm for g in m.gpus if not g.built_for)
        return f"Bản torch này không có mã cho {bad}: cài bản PyTorch có hỗ trợ kiến trúc đó."
    if m.notebook == "Colab":
        return (f"Colab cấp một GPU cho mỗi phiên, nên các ô chạy gloo trên CPU. Muốn NCCL với "
                f"{needed} GPU: {KAGGLE_2GPU}.")
    if m.notebook == "Kaggle":
        return ("Trong notebook Kaggle: Settings → Accelerator → “GPU T4 x2”, rồi chạy lại."
                if needed <= 2 else f"Cần {needed} GPU cho NCCL; Kaggle cho tối đa 2.")
    have = f"Máy có {m.gpu_count} GPU" if m.gpus else "Máy không có GPU"
    where = f" ({KAGGLE_2GPU})" if needed == 2 else ""
    return (f"{have}: kết quả vẫn đúng, chỉ thời gian là minh họa. Muốn NCCL: máy có từ "
            f"{needed} GPU NVIDIA{where}.")


def modes(m: Machine) -> list[Row]:
    """The second table: each part of the book, the mode it takes here, what to change."""
    gpus = _usable_gpus(m)
    default, four = launch.plan(None, gpus=gpus), launch.plan(4, gpus=gpus)
    rows = [
        Row("Các ô nhiều rank của phần 4.1 và 4.2 (launch.spawn, số rank mặc định)",
            _mode(default), "" if default.backend == "nccl" else _more_gpus(m, 2)),
        Row("Các ô 4 rank (4.1.3, 4.2.3, hai node giả lập ở 4.2.4)", _mode(four),
            "" if four.backend == "nccl" else _more_gpus(m, 4)
            + (f" 4 process trên {m.cpu_cores} nhân: chạy được, chậm hơn."
               if m.cpu_cores < 4 else "")),
    ]
    # torchrun's workers pick their backend by the same rule (``torchrun.worker.choose_backend``
    # calls ``launch.pick_backend`` with the number of workers on this host)
    two = launch.plan(2, gpus=gpus)
    rows.append(Row("Script torchrun (4.2.4, 4.2.6, Bài A: --nproc_per_node=2)",
                    _mode(two, "worker")))
    rows.append(precision_row(m, two))
    rows.append(transport_row(m, default))
    if m.unusable_gpus:
        rows.append(Row("make gpu-check", "có GPU nhưng torch không dùng được: lệnh báo lỗi "
                        "(mã thoát 1)", unusable_gpus_advice(m)))
    else:
        rows.append(Row("make gpu-check", f"chạy được trên {m.gpu_count} GPU" if gpus
                        else "không có GPU dùng được: lệnh chỉ báo rồi thoát",
                        "" if gpus else "Chạy lệnh này trên máy có GPU NVIDIA."))
    rows.append(Row("Hình động (phần “Dành cho giảng viên: hình động và công cụ tính”)",
                    "trong trình duyệt, không cần kernel"))
    return rows


def precision_row(m: Machine, two: launch.Plan) -> Row:
    """16-bit compute of 4.2.2's DDP script (``train.mixed_precision``: autocast on a GPU only)
    and of 4.2.3's FSDP mixed precision (``param_dtype=train.amp_dtype(dev)``, bf16 on a CPU)."""
    part = "Độ chính xác hỗn hợp (script DDP 4.2.2, MixedPrecision của FSDP 4.2.3)"
    if two.backend != "nccl":
        return Row(part, "rank trên CPU: DDP không autocast; FSDP tính bằng bf16")
    used = m.gpus[:two.world_size]
    if all(g.native_bf16 for g in used):
        return Row(part, "bf16 (autocast của DDP, param_dtype của FSDP)")
    old = ", ".join(sorted({g.sm for g in used if not g.native_bf16}))
    return Row(part, f"fp16 + GradScaler ({old} không có bf16 gốc)",
               "Không cần đổi gì: script tự chọn fp16 và nhân giá trị mất mát lên trước lượt "
               "truyền ngược (GradScaler; ShardedGradScaler với FSDP1).")


def transport_row(m: Machine, default: launch.Plan) -> Row:
    """How NCCL moves bytes between the GPUs, which sets the bandwidths of 4.2.1 and Bài B."""
    part = "Đo băng thông, thời gian bước (4.2.1, Bài B)"
    if default.backend != "nccl":
        return Row(part, "gloo qua loopback: thời gian chỉ minh họa, số byte vẫn đúng")
    missing = [pair for pair in m.pairs_without_p2p() if max(pair) < default.world_size]
    if not missing:
        return Row(part, "NCCL, P2P trực tiếp giữa các GPU (NVLink hoặc PCIe)")
    mode = "NCCL không có P2P: dữ liệu đi qua bộ nhớ host (transport SHM, trong /dev/shm)"
    small = m.shm_bytes is not None and m.shm_bytes < SHM_MINIMUM
    if small and m.notebook:
        # a cloud notebook cannot resize /dev/shm; NCCL can leave the SHM transport instead
        # (NCCL_SHM_DISABLE, NCCL's environment variables: docs.nvidia.com/deeplearning/nccl/
        # user-guide/docs/env.html), slower but without shared memory (review D21)
        advice = (f"/dev/shm chỉ có {gib(m.shm_bytes)} và {m.notebook} không cho đổi: nếu NCCL "
                  "dừng khi mở bộ nhớ chung, đặt NCCL_SHM_DISABLE=1 trước khi khởi động các "
                  "rank (dữ liệu đi qua socket, chậm hơn).")
    elif small:
        advice = (f"/dev/shm chỉ có {gib(m.shm_bytes)}: NCCL có thể dừng khi mở bộ nhớ chung; "
                  f"chạy container với --shm-size={SHM_ADVISED // 2**30}g hoặc --ipc=host.")
    else:
        advice = "Không cần đổi gì; băng thông đo được là của đường qua host."
    return Row(part, mode, advice)


def table(rows: list[tuple[str, ...]], widths: tuple[int, ...]) -> str:
    """Rows of cells as fixed-width text columns, each cell wrapped inside its column."""
    lines = []
    for row in rows:
        cells = [textwrap.wrap(c, w) or ["—"] for c, w in zip(row, widths)]
        for k in range(max(map(len, cells))):
            parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)]
            lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def report(m: Machine) -> str:
    """Both tables, with their headings."""
    first = table([("Thành phần", "Trên máy này"), ("-" * 24, "-" * 40), *facts(m)], (24, 76))
    second = table([("Phần của sách", "Chế độ trên máy này", "Nên đổi gì"),
                    tuple("-" * w for w in WIDTHS),
                    *((r.part, r.mode, r.advice) for r in modes(m))], WIDTHS)
    return f"Máy này có gì\n\n{first}\n\nSách chạy thế nào trên máy này\n\n{second}"


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m dpbook.doctor",
                            description="Máy này chạy được gì, và mỗi phần của sách sẽ chạy ở "
                                        "chế độ nào.").parse_args(argv)
    print(report(probe()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
