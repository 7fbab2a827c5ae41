"""Fault tolerance (section 4.2.6): FSDP2 training that survives a crashed rank under torchrun.

``torchrun --standalone --nproc_per_node=2 --max_restarts=2 -m dpbook.scripts.resume --steps 12
--ckpt-every 4 --kill-rank 1 --kill-step 7 --ckpt-dir DIR --out FILE``

* Every ``ckpt_every`` steps all ranks save model and Adam state with Distributed Checkpoint into
  ``DIR/step_<n>``; rank 0 then writes a marker file there. Only a directory with the marker
  counts as a checkpoint, so a crash in the middle of a save leaves the previous one as latest.
* At start rank 0 picks the latest complete checkpoint, if any, and broadcasts its choice; every
  rank loads that one and continues after it (ranks that each looked for themselves could pick
  different steps: no shared file system, or NFS caching a directory listing).
* The batch of step ``n`` is a pure function of ``n`` (``batch_indices``): a resumed run sees
  exactly the batches the uninterrupted run saw after that step.
* On the first attempt only (``attempt() == 0``: rank 0 counts the starts of this torchrun job in
  the progress log and broadcasts the number, since ``TORCHELASTIC_RESTART_COUNT`` is kept per
  agent and differs between nodes after a restart), rank ``kill_rank`` sends itself SIGKILL
  right after step ``kill_step``: a real crash, no Python cleanup. torchrun's agent
  sees the dead worker, stops the others and, if ``--max_restarts`` allows, starts them again.
* ``run`` is the same training as a ``launch.spawn`` rank function: a job that simply ends
  after ``--steps`` steps (a scheduler's time limit) and a later job that continues it.
* Rank 0 appends one JSON line per event to ``DIR/progress.jsonl``; at the end it writes the full
  final weights to ``FILE`` (``torch.save``) and a summary per attempt to ``FILE`` with the
  suffix ``.json`` (``read_result`` reads both).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..checks import int_at_least, non_negative
from ..torchrun.worker import process_group
from ._cli import vietnamese_parser

MARKER = "COMPLETE"  # written by rank 0 after every rank finished its part of a save
PROGRESS = "progress.jsonl"
# Test only (tests/scripts/test_resume.py): with this variable set to a number of seconds, in a
# run that starts fresh every worker, after the first checkpoint, writes its pid to
# ``ckpt_dir/pid.<rank>`` and waits there that long (or until the test stops or kills it).
HOLD_VAR = "DPBOOK_TEST_HOLD_AFTER_CKPT_S"


@dataclass(frozen=True)
class ResumeConfig:
    """A run, validated once. ``global_batch`` samples per step, split evenly over the ranks."""

    ckpt_dir: str
    out: str
    steps: int = 12
    ckpt_every: int = 4
    kill_rank: int | None = None
    kill_step: int | None = None
    global_batch: int = 16
    num_samples: int = 64
    lr: float = 1e-2
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "ckpt_every", "global_batch", "num_samples"):
            int_at_least(name, getattr(self, name))
        int_at_least("seed", self.seed, 0)
        non_negative("lr", self.lr)
        if self.ckpt_every > self.steps:
            raise ValueError(f"ckpt_every={self.ckpt_every} phải <= steps={self.steps}, nếu "
                             "không thì không có checkpoint nào được lưu.")
        if self.num_samples % self.global_batch:
            raise ValueError(f"num_samples={self.num_samples} phải chia hết cho "
                             f"global_batch={self.global_batch} (mỗi epoch một số nguyên bước).")
        if (self.kill_rank is None) != (self.kill_step is None):
            raise ValueError("kill_rank và kill_step phải cùng có hoặc cùng vắng.")
        if self.kill_step is not None:
            int_at_least("kill_rank", self.kill_rank, 0)
            if not (isinstance(self.kill_step, int) and 1 <= self.kill_step < self.steps):
                raise ValueError(f"kill_step phải là số nguyên trong [1, {self.steps - 1}] "
                                 f"(trước bước cuối), nhận được {self.kill_step!r}.")


def batch_indices(step: int, cfg: ResumeConfig) -> torch.Tensor:
    """Sample indices of the global batch of ``step`` (1-based): a pure function of the step.

    Epoch ``e`` shuffles with seed ``seed + e`` (what ``DistributedSampler.set_epoch`` does);
    step ``n`` takes the next ``global_batch`` positions of its epoch's permutation.
    """
    int_at_least("step", step)
    per_epoch = cfg.num_samples // cfg.global_batch
    epoch, pos = divmod(step - 1, per_epoch)
    g = torch.Generator().manual_seed(cfg.seed + epoch)
    perm = torch.randperm(cfg.num_samples, generator=g)
    return perm[pos * cfg.global_batch:(pos + 1) * cfg.global_batch]


def checkpoint_path(ckpt_dir: str, step: int) -> Path:
    """Where the checkpoint saved after ``step`` lives: ``ckpt_dir/step_<step>``."""
    return Path(ckpt_dir) / f"step_{step}"


def start_line(ckpt_dir: str) -> str:
    """The one line rank 0 prints at the start of each attempt: where training starts from.
    A missing or empty ``ckpt_dir`` is not an error: this script starts fresh there."""
    step = latest_checkpoint(ckpt_dir)
    if not step:
        return f"Chưa có checkpoint hoàn chỉnh nào trong {ckpt_dir!r}: huấn luyện từ đầu."
    return f"Tiếp tục từ checkpoint {str(checkpoint_path(ckpt_dir, step))!r} (sau bước {step})."


def latest_checkpoint(ckpt_dir: str) -> int:
    """The highest step with a complete checkpoint (marker present) in ``ckpt_dir``; 0 if none.
    A ``step_<n>`` directory without the marker (a save cut short by a crash) is ignored."""
    steps = [int(p.name[5:]) for p in Path(ckpt_dir).glob("step_*")
             if p.name[5:].isdigit() and (p / MARKER).exists()]
    return max(steps, default=0)


def save_checkpoint(model, optimizer, step: int, cfg: ResumeConfig) -> float:
    """Every rank writes its shards with DCP into ``step_<step>``; once ``dcp.save`` has
    returned everywhere (rank 0 writes the metadata last), rank 0 writes the marker. Returns
    the seconds the save took (barrier to barrier)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    dist.barrier()
    t0 = time.perf_counter()
    msd, osd = get_state_dict(model, optimizer)
    path = checkpoint_path(cfg.ckpt_dir, step)
    dcp.save({"model": msd, "optim": osd, "step": step}, checkpoint_id=str(path))
    dist.barrier()  # every rank's shards are on disk before the marker says so
    seconds = time.perf_counter() - t0
    if dist.get_rank() == 0:
        _write_atomically(path / MARKER, json.dumps({"step": step, "seconds": seconds}))
    return seconds


def load_checkpoint(model, optimizer, step: int, cfg: ResumeConfig) -> int:
    """Load ``step_<step>`` into the (wrapped) model and the optimizer; returns the saved step.
    DCP reshards on load: the ranks reading need not be the ranks that wrote."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd, "step": -1}
    dcp.load(state, checkpoint_id=str(checkpoint_path(cfg.ckpt_dir, step)))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return state["step"]


def _write_atomically(path: Path, text: str) -> None:
    """Write to a temporary name, then rename: readers see the whole file or none of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


_ATTEMPT = {"n": 0}  # set by agree_on_start in every rank: the same number everywhere


def attempt() -> int:
    """Which start of the worker group this is: 0 first, then 1, 2... after each restart; the
    number rank 0 chose at the start of ``train`` (``agree_on_start``), 0 before."""
    return _ATTEMPT["n"]


def agree_on_start(cfg: ResumeConfig) -> int:
    """Rank 0 decides where this start of the group resumes (the latest complete checkpoint,
    0 for none) and which start it is, and broadcasts both: every rank then loads the same
    step, even where the ranks see different files (no shared file system, NFS caching).

    Which start: the starts of this torchrun job (``TORCHELASTIC_RUN_ID``) that rank 0 logged in
    ``PROGRESS`` so far. ``TORCHELASTIC_RESTART_COUNT`` cannot say it: each agent keeps its own
    and raises it only when its own workers failed (torch/distributed/elastic/agent/server/
    api.py, ``SimpleElasticAgent._invoke_run``), so after a crash on one node the agents
    disagree. Without torchrun (``launch.spawn``) every call is start 0."""
    choice = [0, 0]
    if dist.get_rank() == 0:
        job = os.environ.get("TORCHELASTIC_RUN_ID")
        starts = sum(1 for e in read_events(cfg.ckpt_dir)
                     if job is not None and e["event"] == "start" and e["job"] == job)
        choice = [latest_checkpoint(cfg.ckpt_dir), starts]
    dist.broadcast_object_list(choice, src=0)
    start, _ATTEMPT["n"] = choice
    return start


def crash_now(cfg: ResumeConfig, step: int, rank: int) -> bool:
    """Whether this rank must crash after ``step``: first attempt, the chosen rank and step."""
    return attempt() == 0 and cfg.kill_step == step and cfg.kill_rank == rank


def _hold(cfg: ResumeConfig, rank: int, seconds: float) -> None:
    """Test only (``HOLD_VAR``): publish this worker's pid, then wait for the test's signal."""
    _write_atomically(Path(cfg.ckpt_dir) / f"pid.{rank}", str(os.getpid()))
    time.sleep(seconds)
    raise SystemExit(f"{HOLD_VAR}: không ai dừng worker rank {rank} sau {seconds} s.")


def _log(cfg: ResumeConfig, **event) -> None:
    """Rank 0 appends one event to the progress log (it survives the crash of an attempt)."""
    if dist.get_rank() == 0:
        with open(Path(cfg.ckpt_dir) / PROGRESS, "a", encoding="utf-8") as f:
            f.write(json.dumps({"job": os.environ.get("TORCHELASTIC_RUN_ID", ""),
                                "attempt": attempt(), "time": time.time(), **event}) + "\n")


def build(cfg: ResumeConfig):
    """The chapter's MLP in float64 (bit-exact comparisons), FSDP2-wrapped, and its Adam."""
    from ..models import build_mlp
    from ..train import apply_fsdp2

    model = apply_fsdp2(build_mlp(seed=cfg.seed).to(torch.float64))
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)


def train(cfg: ResumeConfig) -> dict:
    """The training loop of one attempt, inside an initialised process group. Returns the full
    final weights (on the CPU, every rank) and the step it started from."""
    from ..data import synthetic_regression
    from ..launch import device
    from ..train import full_state_dict, train_step

    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.global_batch % world:
        raise ValueError(f"global_batch={cfg.global_batch} phải chia hết cho world_size={world}.")
    if cfg.kill_rank is not None and cfg.kill_rank >= world:
        raise ValueError(f"kill_rank={cfg.kill_rank} phải nhỏ hơn world_size={world}.")
    model, optimizer = build(cfg)
    start = agree_on_start(cfg)
    if start:
        start = load_checkpoint(model, optimizer, start, cfg)
    _log(cfg, event="start", from_step=start, world_size=world)
    x_all, y_all = (t.to(torch.float64) for t in synthetic_regression(cfg.num_samples).tensors)
    per_rank, dev = cfg.global_batch // world, device()
    for step in range(start + 1, cfg.steps + 1):
        mine = batch_indices(step, cfg)[rank * per_rank:(rank + 1) * per_rank]
        t0 = time.perf_counter()
        loss = train_step(model, optimizer, x_all[mine].to(dev), y_all[mine].to(dev))
        _log(cfg, event="step", step=step, loss=loss, seconds=time.perf_counter() - t0)
        if step % cfg.ckpt_every == 0:
            _log(cfg, event="checkpoint", step=step,
                 seconds=save_checkpoint(model, optimizer, step, cfg))
            if os.environ.get(HOLD_VAR) and start == 0 and step == cfg.ckpt_every:
                _hold(cfg, rank, float(os.environ[HOLD_VAR]))
        if attempt() == 0 and cfg.kill_step == step:
            dist.barrier()  # every rank has finished (and logged) this step
            if crash_now(cfg, step, rank):
                os.kill(os.getpid(), signal.SIGKILL)  # no finally, no atexit: a real crash
    return {"state": full_state_dict(model), "start": start}


def run(rank: int, world_size: int, *jobs: ResumeConfig) -> list[dict]:
    """``launch.spawn`` rank function: ``jobs`` run one after the other in the group that spawn
    made, each as its own job would: a fresh model and optimizer, ``train`` from the latest
    complete checkpoint in its ``ckpt_dir``, nothing carried over in memory. A job simply ends
    after its ``steps``, as when the cluster's scheduler stops it at its time limit. No crash
    here (``kill_step`` needs torchrun, whose agent restarts the workers). Returns, per job,
    the full final weights, the step it started from and, on rank 0, the summary of every
    attempt logged in its ``ckpt_dir`` so far. ``out`` is not written: the weights come back as
    the result."""
    if not jobs or not all(isinstance(cfg, ResumeConfig) for cfg in jobs):
        raise ValueError("Cần ít nhất một ResumeConfig, mỗi job một cái.")
    if any(cfg.kill_step is not None for cfg in jobs):
        raise ValueError("kill_rank/kill_step chỉ dùng được khi chạy bằng torchrun (agent của nó "
                         "khởi động lại worker); với launch.spawn hãy bỏ chúng đi.")
    if not dist.is_initialized() or (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
        raise ValueError(f"rank={rank}, world_size={world_size}: cần chạy trong process group "
                         "mà launch.spawn tạo, với đúng rank và world_size của nó.")
    out = []
    for cfg in jobs:
        Path(cfg.ckpt_dir).mkdir(parents=True, exist_ok=True)
        result = train(cfg)
        dist.barrier()  # rank 0 has logged the last step before it reads the log
        out.append({**result, "summary": summarize(read_events(cfg.ckpt_dir)) if rank == 0
                    else None})
    return out


def summarize(events: list[dict]) -> dict:
    """Per attempt, in order (each "start" event begins one, so a job started again by hand,
    whose ``attempt`` counts from 0 again, is an entry of its own, and so is a job run by
    ``launch.spawn``, which has no torchrun job id): the step it started from, how many steps it ran, the last one, and the downtime before it
    (seconds from the previous attempt's last event to this start); plus the checkpoint save
    times and the step times of every attempt."""
    attempts: list[dict] = []
    last_time = None
    for e in events:
        if e["event"] == "start" or not attempts:  # every attempt logs its start first
            attempts.append({"job": e["job"], "attempt": e["attempt"], "steps_run": 0,
                             "last_step": None, "downtime_s": None})
        a = attempts[-1]
        if e["event"] == "start":
            a.update(from_step=e["from_step"], world_size=e["world_size"])
            if last_time is not None:
                a["downtime_s"] = e["time"] - last_time
        elif e["event"] == "step":
            a["steps_run"] += 1
            a["last_step"] = e["step"]
        last_time = e["time"]
    return {"attempts": attempts,
            "checkpoint_seconds": [e["seconds"] for e in events if e["event"] == "checkpoint"],
            "step_seconds": [e["seconds"] for e in events if e["event"] == "step"],
            "checkpoints": [e["step"] for e in events if e["event"] == "checkpoint"]}


def read_events(ckpt_dir: str) -> list[dict]:
    path = Path(ckpt_dir) / PROGRESS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def read_checkpoint(ckpt_dir: str, step: int) -> tuple[dict, int]:
    """The full model weights and the step of ``step_<step>``, read by this one process without
    a process group: DCP reassembles the shards that N ranks wrote (resharding N -> 1)."""
    import torch.distributed.checkpoint as dcp

    from ..models import build_mlp

    state = {"model": build_mlp().to(torch.float64).state_dict(), "step": -1}
    with warnings.catch_warnings():  # "assuming ... a single process": exactly the intent
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load(state, checkpoint_id=str(checkpoint_path(ckpt_dir, step)), no_dist=True)
    return state["model"], state["step"]


def torchrun_events(output: str, keys: Sequence[str]) -> list[str]:
    """The lines of a torchrun agent's log that contain one of ``keys``, shortened: the level
    letter, the source file and the message, without date, pid and path."""
    pattern = re.compile(r"^([IWE])\d{4} [\d:.]+ \d+ \S*?([\w.]+:\d+)\] (.*)$")
    lines = []
    for line in output.splitlines():
        if any(k in line for k in keys):
            m = pattern.match(line)
            lines.append(f"{m[1]} {m[2]}] {m[3]}" if m else line)
    return lines


def waste_fraction(interval_s: float, save_s: float, mtbf_s: float,
                   restart_s: float = 0.0, durable_after_s: float = 0.0) -> float:
    """Share of the time lost to fault tolerance, to first order: writing a checkpoint every
    ``interval_s`` seconds of training costs ``save_s / interval_s`` (the time training is
    blocked); a failure every ``mtbf_s`` seconds on average loses half an interval of work plus
    the restart.

    ``durable_after_s``: with an asynchronous save (``dcp.async_save``), training goes on while
    a background thread writes, and the checkpoint counts only once that write has finished,
    ``durable_after_s`` seconds after training resumed. A failure in that window falls back to
    the checkpoint before, so a failure loses ``interval_s / 2 + durable_after_s`` on average.
    The next save must not start before the previous one is durable: ``durable_after_s`` is at
    most ``interval_s``."""
    for name, v in (("interval_s", interval_s), ("save_s", save_s), ("mtbf_s", mtbf_s)):
        non_negative(name, v)
        if v == 0 and name != "save_s":
            raise ValueError(f"{name} phải dương, nhận được 0.")
    non_negative("restart_s", restart_s)
    non_negative("durable_after_s", durable_after_s)
    if durable_after_s > interval_s:
        raise ValueError(f"durable_after_s={durable_after_s} phải <= interval_s={interval_s}: lần "
                         "lưu sau không được bắt đầu trước khi lần lưu trước ghi xong.")
    return save_s / interval_s + (interval_s / 2 + durable_after_s + restart_s) / mtbf_s


def young_interval(save_s: float, mtbf_s: float) -> float:
    """The interval that minimises ``waste_fraction``: sqrt(2 * save_s * mtbf_s) (Young).
    ``restart_s`` and ``durable_after_s`` add a constant to the waste and do not move it."""
    non_negative("save_s", save_s)
    non_negative("mtbf_s", mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s)


def read_result(out: str) -> tuple[dict, dict]:
    """What a finished run left: the full final weights and the JSON summary."""
    state = torch.load(out, weights_only=True)
    return state, json.loads(Path(out).with_suffix(".json").read_text(encoding="utf-8"))


def parse_args(argv: Sequence[str] | None = None) -> ResumeConfig:
    """The command line of ``python -m dpbook.scripts.resume`` (help in Vietnamese)."""
    d = ResumeConfig(ckpt_dir="", out="")
    p = vietnamese_parser(prog="python -m dpbook.scripts.resume",
                          description="Huấn luyện FSDP2 chịu lỗi: checkpoint DCP định kỳ, "
                                      "tiếp tục từ checkpoint mới nhất (mục 4.2.6).")
    p.add_argument("--ckpt-dir", required=True,
                   help="thư mục chứa các checkpoint step_<n> (ví dụ _build/runs/ckpt); chưa có "
                        "hoặc rỗng thì huấn luyện từ đầu")
    p.add_argument("--out", required=True,
                   help="file trọng số cuối, rank 0 ghi (ví dụ _build/runs/final.pt); bản tóm "
                        "tắt JSON nằm cạnh, đuôi .json")
    p.add_argument("--steps", type=int, default=d.steps, help="tổng số bước huấn luyện")
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every,
                   help="lưu checkpoint sau mỗi bao nhiêu bước")
    p.add_argument("--kill-rank", type=int, default=None,
                   help="rank tự hủy (SIGKILL) ở lần chạy đầu tiên")
    p.add_argument("--kill-step", type=int, default=None,
                   help="rank đó tự hủy ngay sau bước này (1 <= kill-step < steps)")
    p.add_argument("--global-batch", type=int, default=d.global_batch,
                   help="số mẫu mỗi bước, cộng trên mọi rank")
    p.add_argument("--num-samples", type=int, default=d.num_samples, help="số mẫu huấn luyện")
    p.add_argument("--lr", type=float, default=d.lr, help="tốc độ học của Adam")
    p.add_argument("--seed", type=int, default=d.seed, help="hạt giống: trọng số và dữ liệu")
    args = p.parse_args(argv)
    if os.path.exists(args.ckpt_dir) and not os.path.isdir(args.ckpt_dir):
        p.error(f"--ckpt-dir {args.ckpt_dir!r} là một file; hãy cho một thư mục (chưa có thì "
                "script tạo).")
    if os.path.isdir(args.out):
        p.error(f"--out {args.out!r} là một thư mục; hãy cho đường dẫn file, ví dụ "
                "_build/runs/final.pt.")
    try:
        return ResumeConfig(**vars(args))
    except ValueError as err:
        p.error(str(err))  # exits with status 2: the usage line, then the message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point under torchrun: process group from the environment (NCCL with one GPU per
    local process, else gloo), train, rank 0 writes the results; the group is always destroyed."""
    cfg = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("Hãy chạy bằng torchrun: torchrun --nproc_per_node=2 -m dpbook.scripts.resume …")
    with process_group():
        Path(cfg.ckpt_dir).mkdir(parents=True, exist_ok=True)
        if dist.get_rank() == 0:
            print(start_line(cfg.ckpt_dir), flush=True)  # what rank 0 is about to choose
        result = train(cfg)
        if dist.get_rank() == 0:
            Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
            torch.save(result["state"], cfg.out)
            summary = {"config": asdict(cfg), **summarize(read_events(cfg.ckpt_dir))}
            _write_atomically(Path(cfg.out).with_suffix(".json"), json.dumps(summary, indent=1))
            print(f"Xong: lần chạy {attempt()}, tiếp tục từ bước {result['start']}, "
                  f"đến bước {cfg.steps}.", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
