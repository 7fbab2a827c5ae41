"""Section 4.2.7 (Thực hành hiện đại (II): FSDP2 — prefetch, offload, tính lại activation, torch.compile).

Rank functions for ``launch.spawn`` and the formulas the page checks them against.

* Prefetching: ``prefetch_runs`` records the lifecycle trace of one step
  (``tracing.lifecycle.record_lifecycle``) with FSDP2's implicit prefetch and with explicit
  prefetch of 1 and 2 units (``lifecycle.set_prefetch``), and the bytes this rank holds when each
  Block starts computing (``MemoryProbe``); ``prefetched_bytes`` is what explicit prefetch adds.
* ``reshard_to_smaller_group`` (4 ranks): ``reshard_after_forward=2``, ZeRO++ hpZ's idea;
  ``post_forward_size`` is torch's rule for the int, ``accepted_int_sizes`` the ints it accepts,
  ``post_forward_bytes`` what a rank keeps (its 1/N shard too) and ``held_param_bytes`` counts it.
* ``offload_runs``: ``CPUOffloadPolicy`` against no offload: where the shards live, the bytes.
* ``recompute_runs``: activation checkpointing (``apply_activation_checkpointing``) on the
  bucket model under FSDP2; ``checkpoint_demo`` is ``torch.utils.checkpoint.checkpoint`` by hand
  in one process; ``activation_bytes`` and ``recompute_flops`` are the formulas.
* ``compile_runs``: ``torch.compile`` of DDP (DDPOptimizer splits the graph at bucket boundaries,
  ``ddp_optimizer_buckets`` is its rule) and of FSDP2 block by block; ``inductor_compile``: one
  Block compiled by inductor in one process, for its compile time and step time on this CPU.
* ``tour``: every 2-rank run above in one launch.
"""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist

from ..checks import int_at_least
from ..data import rank_batch, synthetic_regression
from ..launch import device
from ..measure import CommLog, local_bytes, settle_collectives, state_bytes, time_steps
from ..models import BucketBlock, build_bucket_net, build_mlp
from ..tracing.lifecycle import record_lifecycle, set_prefetch
from ..train import apply_ddp, apply_fsdp2, shard_blocks, train_step

DEPTH = 3  # Blocks of the prefetch model: build_mlp(depth=3), as in the lifecycle animation
PREFETCH = (0, 1, 2)  # 0: FSDP2's implicit prefetching; k: explicit, k units ahead
BATCH = 4  # samples per rank, prefetch and offload runs
AC_BATCH = 64  # samples per rank, activation checkpointing runs
COMPILE_MODEL = {"in_dim": 512, "hidden": 512, "depth": 4, "out_dim": 4}  # ~1 MiB per Block
FSDP_COMPILE_MODEL = {"in_dim": 32, "hidden": 32, "depth": 3, "out_dim": 4}  # 3 equal Blocks
BUCKET_CAP_MB = 1  # DDP's bucket cap in the compile run (DDPOptimizer needs >= 1 MiB)
COMPILE_BACKEND = "aot_eager"  # Dynamo + AOTAutograd graphs, no kernel generation (see page)
FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: DDPOptimizer's first


# ------------------------------------------------------------------ formulas (no processes)

def prefetched_bytes(block_bytes, k: int) -> list[int]:
    """Bytes of full parameters that explicit prefetch of ``k`` units adds while Block ``i``
    computes in forward: the AllGather outputs of Blocks ``i+1 … i+k`` (fewer at the end)."""
    int_at_least("k", k, 0)
    b = list(block_bytes)
    return [sum(b[i + 1:i + 1 + k]) for i in range(len(b))]


def held_bytes(block_bytes, root_bytes: int, activation_per_block: int, k: int = 0) -> list[int]:
    """Bytes a FULL_SHARD FSDP2 rank holds, beyond its shards, when Block ``i`` starts its
    forward: the root's full parameters (gathered first, kept), Block ``i``'s full parameters
    twice (the unsharded parameters, and the AllGather output that FSDP2 frees only after the
    next unit's copy-out, see ``FSDPParamGroup.wait_for_unshard``), the activations of the
    ``i`` Blocks before it, and what prefetch of ``k`` units adds (``prefetched_bytes``)."""
    extra = prefetched_bytes(block_bytes, k)
    return [root_bytes + 2 * b + i * activation_per_block + extra[i]
            for i, b in enumerate(block_bytes)]


def post_forward_size(reshard_after_forward, shard_size: int):
    """What ``fully_shard`` makes of ``reshard_after_forward`` on a shard group of
    ``shard_size`` ranks (``_get_post_forward_mesh_info`` in ``_fsdp_init.py``): ``True`` or
    ``False`` as given; an int ``k`` must divide ``shard_size``; ``1`` means ``False`` and
    ``shard_size`` means ``True``; any other ``k`` reshards to groups of ``k`` ranks."""
    int_at_least("shard_size", shard_size)
    if isinstance(reshard_after_forward, bool):
        return reshard_after_forward
    if not isinstance(reshard_after_forward, int):
        raise ValueError(f"reshard_after_forward phải là bool hoặc int, nhận được "
                         f"{reshard_after_forward!r}.")
    k = reshard_after_forward
    if k < 1 or shard_size % k:
        raise ValueError(f"reshard_after_forward={k} phải là ước của số rank trong nhóm shard "
                         f"({shard_size}).")
    return False if k == 1 else True if k == shard_size else k


def post_forward_bytes(param_bytes: int, shard_size: int, reshard_after_forward) -> float:
    """Parameter bytes a rank keeps for a unit between forward and backward. The ``1/N`` shard
    (``FSDPParam._sharded_param_data``, the one the optimizer updates) is never freed; on top of
    it, an int ``k`` keeps a new ``1/k`` shard (``FSDPParam.to_sharded_post_forward`` clones it
    out of the AllGather output) and ``False`` the full unsharded parameters."""
    size = post_forward_size(reshard_after_forward, shard_size)
    primary = param_bytes / shard_size
    return primary + (0 if size is True else param_bytes if size is False else param_bytes / size)


def accepted_int_sizes(shard_size: int) -> list[int]:
    """The ints ``k`` that ``reshard_after_forward=k`` turns into a smaller reshard group on a
    shard group of ``shard_size`` ranks (``post_forward_size`` gives an int back): the
    divisors other than 1 (``False``) and ``shard_size`` (``True``)."""
    int_at_least("shard_size", shard_size)
    return [k for k in range(1, shard_size + 1) if shard_size % k == 0
            and not isinstance(post_forward_size(k, shard_size), bool)]


def activation_bytes(batch_size: int, d_in: int = 32, d: int = 64, hidden=(128, 256, 512),
                     d_out: int = 256, checkpointed: bool = False) -> int:
    """Bytes that one forward of ``BucketNet`` (fp32) leaves alive for backward: the output of
    ``inp`` (B x d); per block the LayerNorm's mean and rstd (B each), its output (B x d), the
    ReLU's output (B x h) and the block's output (B x d); the head's output (B x d_out). With
    every block checkpointed, a block keeps only its output (the next block's input)."""
    for name, value in (("batch_size", batch_size), ("d_in", d_in), ("d", d), ("d_out", d_out)):
        int_at_least(name, value)
    per_block = [d if checkpointed else 2 + d + h + d for h in hidden]
    return 4 * batch_size * (d + sum(per_block) + d_out)


def recompute_flops(batch_size: int, d: int = 64, hidden=(128, 256, 512)) -> int:
    """FLOPs that non-reentrant checkpointing recomputes in backward, as ``FlopCounterMode``
    counts them (matrix products, 2 per multiply-add): each block's ``fc1`` only. Recomputation
    stops early (``early_stop=True``) once the saved tensors backward needs are back; ``fc2``'s
    output is not one of them (the residual add saves nothing)."""
    int_at_least("batch_size", batch_size)
    return sum(2 * batch_size * d * h for h in hidden)


def ddp_optimizer_buckets(param_bytes, cap: int, first_cap: int = FIRST_BUCKET_BYTES) -> list[int]:
    """DDPOptimizer's split (``compile_fn`` in ``torch/_dynamo/backends/distributed.py``):
    walk the layers from the last to the first, adding each layer's parameter bytes, and start
    a new bucket (a graph break) once the current one holds ``cap`` bytes or more, or, for the
    first bucket, ``first_cap`` (Dynamo always passes torch's default 1 MiB). Returns the bucket
    sizes from the first layer's to the last's: one compiled subgraph each. (Torch checks at
    every graph node and may extend a bucket until it has an output; for a chain of layers the
    split is the same.)"""
    int_at_least("cap", cap)
    int_at_least("first_cap", first_cap)
    if first_cap > cap:
        raise ValueError(f"DDPOptimizer cần bucket_cap_mb đủ lớn: bucket đầu của nó có cỡ "
                         f"{first_cap} byte, lớn hơn cap={cap} byte; torch từ chối (AssertionError "
                         f"'First bucket should be smaller/equal to other buckets').")
    buckets = [0]
    for nbytes in reversed(list(param_bytes)):
        if buckets[0] >= cap or (len(buckets) == 1 and buckets[0] >= first_cap):
            buckets.insert(0, 0)
        buckets[0] += nbytes
    return buckets


def issue_order(events, phase: str = "forward") -> list[tuple[str, int]]:
    """What a rank issued in ``phase`` of a lifecycle trace (``lifecycle.TraceEvent``s with
    units assigned), in order: ``("AllGather", unit)``, and in forward ``("compute", unit)`` when
    a unit starts computing (its ``forward_compute`` hook, after FSDP's pre-forward), in backward
    ``("done", unit)`` when a unit has computed its input gradient (``backward_post``; not
    recorded for Block 0, whose input needs none). The backward pre-hook is no marker: on a
    Block it fires before FSDP's own pre-backward hook."""
    ends = {"forward": ("forward_compute", "compute"), "backward": ("backward_post", "done")}
    if phase not in ends:
        raise ValueError(f"phase={phase!r} không hợp lệ; chỉ nhận 'forward' hoặc 'backward'.")
    hook, word = ends[phase]
    out = []
    for e in events:
        if e.phase == phase and e.kind == "collective" and e.collective == "all_gather":
            out.append(("AllGather", e.unit))
        elif e.phase == phase and e.kind == hook:
            out.append((word, e.unit))
    return out


def gathered_before(order, unit: int, marker: str = "compute") -> list[int]:
    """The units whose AllGather appears in ``order`` (``issue_order``) before ``(marker,
    unit)``: "compute" in forward, "done" in backward."""
    at = order.index((marker, unit))
    return [u for kind, u in order[:at] if kind == "AllGather"]


# ------------------------------------------------------------------ measuring on a rank

class MemoryProbe:
    """Bytes allocated on this rank at chosen moments (``mark``), relative to the first mark:
    CUDA's counter on a GPU; on the CPU, the current snapshot of PyTorch's ``MemTracker``, which
    must be created with the model and optimizer it should count (``tracked``). On the CPU each
    mark first lets gloo release the collectives that have finished (``settle_collectives``):
    without it a mark right after forward saw the last AllGather output in about 1,5 % of marks
    (``settle=False`` shows it, ``benchmarks/fsdp_memory_race.py``)."""

    def __init__(self, *tracked, settle: bool = True):
        self.marks: list[tuple[str, int]] = []
        self.cuda = device().type == "cuda"
        self.settle = settle
        self.method = "cuda" if self.cuda else "memtracker"
        if not self.cuda:
            from torch.distributed._tools.mem_tracker import MemTracker

            self._tracker = MemTracker()
            self._tracker.track_external(*tracked)

    def __enter__(self):
        if not self.cuda:
            self._tracker.__enter__()
            self._tracker.reset_mod_stats()
        return self

    def __exit__(self, *exc):
        return None if self.cuda else self._tracker.__exit__(*exc)

    def now(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated()
        if self.settle:
            settle_collectives()
        snap = self._tracker.get_tracker_snapshot("current")
        return int(next(v for k, v in snap.items() if torch.device(k).type == "cpu")["Total"])

    def mark(self, tag: str) -> None:
        self.marks.append((tag, self.now()))

    def relative(self) -> dict[str, int]:
        return {tag: b - self.marks[0][1] for tag, b in self.marks}


def _data(rank: int, world_size: int, batch_size: int, d_in: int, d_out: int):
    ds = synthetic_regression(batch_size * world_size, d_in, d_out)
    return rank_batch(ds.tensors, rank, batch_size, device())


def held_at_compute(rank: int, world_size: int, k: int, batch_size: int = BATCH) -> dict:
    """FULL_SHARD FSDP2 on ``build_mlp(depth=DEPTH)`` with prefetch ``k`` (0: implicit): bytes
    held when each Block starts computing (a pre-hook on its Linear runs after FSDP's
    pre-forward), relative to the start of forward."""
    model = build_mlp(depth=DEPTH)
    apply_fsdp2(model, reshard_after_forward=True)
    if k:
        set_prefetch(model.blocks, k, k)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = _data(rank, world_size, batch_size, 16, 4)
    train_step(model, opt, x, y)  # Adam's state exists; gradients are None again
    with MemoryProbe(model, opt) as probe:
        hooks = [b.linear.register_forward_pre_hook(lambda *_, i=i: probe.mark(f"Block {i}"))
                 for i, b in enumerate(model.blocks)]
        probe.mark("start")
        model(x)
    for h in hooks:
        h.remove()
    return {"held": probe.relative(), "method": probe.method}


def prefetch_runs(rank: int, world_size: int, depths=PREFETCH) -> dict:
    """For each prefetch depth: the lifecycle trace of one step and ``held_at_compute``."""
    return {"traces": {k: record_lifecycle(rank, world_size, "FULL_SHARD", True, DEPTH, BATCH,
                                           prefetch=k) for k in depths},
            "memory": {k: held_at_compute(rank, world_size, k) for k in depths}}


def held_param_bytes(model) -> int:
    """Bytes of parameter storage this rank holds for a FSDP2 model: the distinct storages of
    the registered parameters' local tensors and of every ``FSDPParam._sharded_param_data``
    (the ``1/N`` shard, which is not a registered parameter while the unit is unsharded or
    resharded to a smaller group). Each storage is counted once."""
    from torch.distributed.fsdp import FSDPModule

    tensors = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    for module in model.modules():
        if isinstance(module, FSDPModule):
            group = module._get_fsdp_state()._fsdp_param_group
            tensors += [fp._sharded_param_data for fp in (group.fsdp_params if group else [])]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
                if t.untyped_storage().nbytes() > 0}
    return sum(storages.values())


def reshard_to_smaller_group(rank: int, world_size: int, sizes=(True, 2, False)) -> dict:
    """One step of FSDP2 (every unit, root included, given the same ``reshard_after_forward``)
    per value in ``sizes``: every collective (kind, pass, bytes, group); between forward and
    backward, the bytes of the registered parameters (``registered``) and of all parameter
    storage the rank holds (``between``, ``held_param_bytes``); the same at rest (``rest``)."""
    out = {}
    for raf in sizes:
        model = build_mlp(depth=DEPTH)
        apply_fsdp2(model, reshard_after_forward=raf)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = _data(rank, world_size, BATCH, 16, 4)
        train_step(model, opt, x, y)
        with CommLog() as log:
            loss = torch.nn.functional.mse_loss(model(x), y)
            registered = sum(local_bytes(p) for p in model.parameters())
            between = held_param_bytes(model)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out[raf] = {"records": log.records, "registered": registered, "between": between,
                    "rest": held_param_bytes(model)}
    return out


def _bytes_on(dev: torch.device, model, opt) -> int:
    """Training-state bytes (parameters, gradients, optimizer state) stored on ``dev``."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()
                                                 if p.grad is not None]
    tensors += [v for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor) and v.numel() > 1]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local if t.device.type == dev.type)


def offload_runs(rank: int, world_size: int, steps: int = 3) -> dict:
    """FULL_SHARD FSDP2 without and with ``CPUOffloadPolicy`` (pinned memory where a GPU
    exists: pinning needs an accelerator), ``steps`` steps each: where the shards live, the
    state bytes, the bytes on this rank's device and the final weights."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    dev = device()
    out = {}
    for name, policy in (("không offload", OffloadPolicy()),
                         ("CPUOffloadPolicy", CPUOffloadPolicy(pin_memory=dev.type == "cuda"))):
        model = build_mlp(depth=DEPTH)
        apply_fsdp2(model, reshard_after_forward=True, offload_policy=policy)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = _data(rank, world_size, BATCH, 16, 4)
        for _ in range(steps - 1):
            train_step(model, opt, x, y)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        shard = model.blocks[0].linear.weight
        out[name] = {"param_device": str(shard.to_local().device),
                     "pinned": shard.to_local().is_pinned(),
                     "grad_device": str(shard.grad.to_local().device),
                     "state": state_bytes(model, opt), "on_device": _bytes_on(dev, model, opt),
                     "device": str(dev),
                     "weights": [p.full_tensor().cpu() for p in model.parameters()]}
        opt.zero_grad(set_to_none=True)
    return out


def _count_flops(model, x, y) -> tuple[int, int]:
    """(forward FLOPs, forward + backward FLOPs) of one step, by ``FlopCounterMode``."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss = torch.nn.functional.mse_loss(model(x), y)
        forward = counter.get_total_flops()
        loss.backward()
    return forward, counter.get_total_flops()


def recompute_runs(rank: int, world_size: int, batch_size: int = AC_BATCH) -> dict:
    """``BucketNet`` under FSDP2 (one unit per block), without and with activation
    checkpointing of every block (``apply_activation_checkpointing``, then ``fully_shard`` on
    the wrapped blocks, torchtitan's order): bytes alive after forward, peak of a step and
    FLOPs (the time is measured by ``checkpoint_demo``, without FSDP's collectives), and
    ``pre_forward``: how many times FSDP2's pre-forward hook ran in one forward and in the
    backward after it (the recomputation inside a ``CheckpointWrapper`` does not call it)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper, apply_activation_checkpointing)

    from ..measure import peak_memory

    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    out = {}
    for mode in ("không", "có"):
        # Count FSDP2's pre-forward hook per pass: patched before fully_shard registers it
        calls, phase, original = {"forward": 0, "backward": 0}, ["forward"], FSDPState._pre_forward

        def counted(self, *args, **kwargs):
            calls[phase[0]] += 1
            return original(self, *args, **kwargs)

        FSDPState._pre_forward = counted
        try:
            model = build_bucket_net()
            if mode == "có":
                apply_activation_checkpointing(model,
                                               check_fn=lambda m: isinstance(m, BucketBlock))
            shard_blocks(model.to(device()), CheckpointWrapper if mode == "có" else BucketBlock,
                         reshard_after_forward=True)
        finally:
            FSDPState._pre_forward = original
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = _data(rank, world_size, batch_size, 32, 256)
        train_step(model, opt, x, y)
        calls.update(forward=0, backward=0)
        with MemoryProbe(model, opt) as probe:
            probe.mark("start")
            out_ = model(x)
            probe.mark("after forward")
            phase[0] = "backward"
            torch.nn.functional.mse_loss(out_, y).backward()
        pre_forward = dict(calls)
        opt.zero_grad(set_to_none=True)
        forward, total = _count_flops(model, x, y)
        opt.zero_grad(set_to_none=True)
        peak = peak_memory(lambda: train_step(model, opt, x, y), model, opt)
        out[mode] = {"alive": probe.relative()["after forward"], "method": probe.method,
                     "forward_flops": forward, "step_flops": total, "peak": peak.peak,
                     "blocks": [type(getattr(model, f"b{i}")).__name__ for i in range(3)],
                     "pre_forward": pre_forward}
        # FSDP2 holds reference cycles: without this the first model is still allocated while
        # the second measures its peak, and on CUDA the peak counts it (gpu-path review D12)
        del model, opt, probe, out_, x, y
        gc.collect()
    return out


def checkpoint_demo(batch_size: int = AC_BATCH, repeats: int = 3) -> dict:
    """One process, no wrapper: ``BucketNet``'s forward written out, each block called plainly
    or through ``checkpoint(block, x, use_reentrant=False)``; bytes alive after forward, FLOPs
    and median time of forward + backward (``repeats`` runs; 0: not timed), all on the CPU."""
    int_at_least("repeats", repeats, 0)
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    x = synthetic_regression(batch_size, 32, 256).tensors[0]
    out = {}
    for mode in ("không", "có"):
        model = build_bucket_net()

        def forward(use=mode == "có"):
            h = model.inp(x)
            for i in range(model.n_blocks):
                block = getattr(model, f"b{i}")
                h = checkpoint(block, h, use_reentrant=False) if use else block(h)
            return model.head(h)

        with MemoryProbe(model) as probe:
            probe.mark("start")
            y = forward()
            probe.mark("after forward")
        with FlopCounterMode(display=False) as counter:
            forward().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        step_s = None
        if repeats:
            times = sorted(time_steps(lambda: forward().sum().backward(), repeats=repeats,
                                      dev=torch.device("cpu")))
            step_s = times[len(times) // 2]
        out[mode] = {"alive": probe.relative()["after forward"],
                     "step_flops": counter.get_total_flops(), "grads": grads,
                     "output": y.detach(), "step_s": step_s}
    return out


def compile_ddp(rank: int, world_size: int, optimize_ddp: bool = True, steps: int = 2) -> dict:
    """``torch.compile(DDP(model, bucket_cap_mb=1))`` with a backend that only counts the
    graphs it is given (and runs them eagerly), ``torch._dynamo.config.optimize_ddp`` as
    given: the parameter bytes in each compiled graph, in graph order, and the bytes of each
    bucket DDP's reducer all-reduces in the last step (a comm hook sees them), in launch order."""
    import torch._dynamo
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch._dynamo.reset()
    graphs: list[int] = []

    def counting_backend(gm, example_inputs):
        values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        graphs.append(sum(v.untyped_storage().nbytes() for v in values
                          if isinstance(v, torch.nn.Parameter)))
        return gm.forward

    ddp = apply_ddp(build_mlp(**COMPILE_MODEL), bucket_cap_mb=BUCKET_CAP_MB)
    seen: list[int] = []

    def hook(state, bucket):
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, hook)
    compiled = torch.compile(ddp, backend=counting_backend)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x, y = _data(rank, world_size, 8, COMPILE_MODEL["in_dim"], COMPILE_MODEL["out_dim"])
    t0 = time.perf_counter()
    with torch._dynamo.config.patch(optimize_ddp=optimize_ddp):
        for _ in range(steps):
            seen.clear()
            train_step(compiled, opt, x, y)
    return {"graphs": graphs, "buckets": list(seen), "seconds": time.perf_counter() - t0}


def compile_fsdp2(rank: int, world_size: int, backend: str = COMPILE_BACKEND) -> dict:
    """FSDP2 on ``build_mlp(**FSDP_COMPILE_MODEL)``: eager, then with each Block compiled
    (``block.compile(backend=...)`` after ``fully_shard``; FSDP2's hooks stay eager). The first
    compiled step's time (it compiles), the median eager and compiled step times, the graphs
    Dynamo captured and the weights after the same steps."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    out = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        counters.clear()
        model = build_mlp(**FSDP_COMPILE_MODEL)
        apply_fsdp2(model, reshard_after_forward=True)
        if mode == "compiled":
            for block in model.blocks:
                block.compile(backend=backend)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = _data(rank, world_size, BATCH, FSDP_COMPILE_MODEL["in_dim"], 4)
        t0 = time.perf_counter()
        losses = [train_step(model, opt, x, y)]
        first = time.perf_counter() - t0
        times = time_steps(lambda: losses.append(train_step(model, opt, x, y)), repeats=3,
                           warmup=0)
        out[mode] = {"first_s": first, "step_s": sorted(times)[len(times) // 2],
                     "graphs": counters["stats"]["unique_graphs"],
                     "calls": counters["stats"]["calls_captured"], "losses": losses,
                     "weights": [p.full_tensor().cpu() for p in model.parameters()]}
    out["backend"] = backend
    return out


def inductor_compile(repeats: int = 20) -> dict:
    """One process: a Block of ``FSDP_COMPILE_MODEL`` compiled by inductor (``torch.compile``'s
    default backend: C++ kernels built with the system's compiler), forward and backward. The
    first call's time (Dynamo, AOTAutograd, inductor's code generation and the C++ build, unless
    inductor's disk cache already holds the same graphs: ``cache_hits`` says), the median step
    of ``repeats`` eager and compiled, and the largest difference in outputs and gradients."""
    int_at_least("repeats", repeats, 1)
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    block = build_mlp(**FSDP_COMPILE_MODEL).blocks[1]
    x = torch.randn(BATCH, FSDP_COMPILE_MODEL["hidden"], generator=torch.Generator().manual_seed(0))

    def step(fn):
        block.zero_grad()
        y = fn(x.requires_grad_())
        y.sum().backward()
        return [y.detach(), *(p.grad.clone() for p in block.parameters())]

    cpu = torch.device("cpu")
    # one compile worker: on 2 cores a pool of them only competes with the compiler itself
    with inductor_config.patch(compile_threads=1):
        compiled = torch.compile(block)
        t0 = time.perf_counter()
        got = step(compiled)
        first = time.perf_counter() - t0
        want = step(block)
        times = {name: sorted(time_steps(lambda: step(fn), repeats=repeats, dev=cpu))
                 for name, fn in (("eager", block), ("compiled", compiled))}
    return {"first_s": first, "eager_s": times["eager"][repeats // 2],
            "compiled_s": times["compiled"][repeats // 2],
            "max_diff": max((a - b).abs().max().item() for a, b in zip(got, want)),
            "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "graphs": counters["stats"]["unique_graphs"]}


def compile_runs(rank: int, world_size: int) -> dict:
    """DDP compiled with and without DDPOptimizer, then FSDP2 compiled block by block."""
    return {"ddp": {opt: compile_ddp(rank, world_size, opt) for opt in (True, False)},
            "fsdp2": compile_fsdp2(rank, world_size)}


def tour(rank: int, world_size: int) -> dict:
    """Every 2-rank run of the page in one launch (starting processes is what costs time)."""
    timings = {}
    out = {}
    for name, fn in (("prefetch", prefetch_runs), ("offload", offload_runs),
                     ("recompute", recompute_runs), ("compile", compile_runs)):
        t0 = time.perf_counter()
        out[name] = fn(rank, world_size)
        timings[name] = time.perf_counter() - t0
    out["seconds"] = timings
    return out
