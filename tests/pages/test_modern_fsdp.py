"""Section 4.2.7, part II (``dpbook.pages.modern_fsdp``): the formulas the page checks its runs
against, and torch's rules they restate; one distributed test (two gloo ranks) for the release of
the first model in ``recompute_runs``.

The numbers are those of the page's models: ``build_mlp(depth=3)`` (Blocks of 544, 1 056 and
1 056 parameters, a root head of 132; fp32: 2 176, 4 224, 4 224 and 528 bytes) and
``build_bucket_net()`` (d = 64, hidden widths 128, 256, 512, input 32, output 256).
"""

import inspect

import pytest
import torch

from dpbook import launch
from dpbook.models import build_mlp
from dpbook.pages import modern_fsdp

BLOCKS = [2176, 4224, 4224]
ROOT = 528


def test_the_block_bytes_are_those_of_the_page_model():
    model = build_mlp(depth=modern_fsdp.DEPTH)
    assert [4 * sum(p.numel() for p in b.parameters()) for b in model.blocks] == BLOCKS
    assert 4 * sum(p.numel() for p in model.head.parameters()) == ROOT


@pytest.mark.parametrize("k, extra", [(0, [0, 0, 0]), (1, [4224, 4224, 0]),
                                      (2, [8448, 4224, 0]), (5, [8448, 4224, 0])])
def test_prefetch_adds_the_next_units_full_bytes(k, extra):
    assert modern_fsdp.prefetched_bytes(BLOCKS, k) == extra


def test_held_bytes_count_the_root_two_copies_activations_and_prefetch():
    # 4 samples x 32 features x 4 bytes of activation per Block before Block i
    assert modern_fsdp.held_bytes(BLOCKS, ROOT, 512) == [4880, 9488, 10000]
    assert modern_fsdp.held_bytes(BLOCKS, ROOT, 512, 1) == [9104, 13712, 10000]
    assert modern_fsdp.held_bytes(BLOCKS, ROOT, 512, 2) == [13328, 13712, 10000]


def test_post_forward_size_follows_fully_shard():
    size = modern_fsdp.post_forward_size
    assert size(True, 4) is True and size(False, 4) is False
    assert size(2, 4) == 2 and size(1, 4) is False and size(4, 4) is True
    assert size(2, 2) is True  # on 2 ranks an int can only mean True or False
    for bad in (3, 0, 8, "2", 2.0):
        with pytest.raises(ValueError, match="reshard_after_forward"):
            size(bad, 4)
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_post_forward_mesh_info
    src = inspect.getsource(_get_post_forward_mesh_info)
    assert "shard_mesh_size % reshard_after_forward != 0" in src
    assert "mesh_info.mesh.mesh.view(-1, reshard_after_forward)" in src


def test_post_forward_bytes_keep_the_1_over_n_shard_too():
    full = 4 * 2788  # the whole MLP, fp32
    assert modern_fsdp.post_forward_bytes(full, 4, True) == 2788
    assert modern_fsdp.post_forward_bytes(full, 4, 2) == 2788 + 5576  # 1/4 shard + new 1/2 shard
    assert modern_fsdp.post_forward_bytes(full, 4, False) == full + 2788
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    src = inspect.getsource(FSDPParam.to_sharded_post_forward)
    assert ").clone()  # clone to be able to free all-gather output" in src
    assert "free_storage(self._sharded_param_data" not in inspect.getsource(FSDPParam)


def test_accepted_int_sizes_are_torchs():
    from types import SimpleNamespace
    from unittest import mock

    from torch.distributed.fsdp._fully_shard import _fsdp_init

    for n in (4, 12, 64):
        info = SimpleNamespace(shard_mesh_size=n,
                               mesh=SimpleNamespace(mesh=torch.arange(n), device_type="cpu"))
        smaller = []
        with mock.patch.object(_fsdp_init, "DeviceMesh", lambda device_type, t: t), \
                mock.patch.object(_fsdp_init, "HSDPMeshInfo", lambda m, **kw: m):
            for k in range(1, n + 1):
                try:
                    got = _fsdp_init._get_post_forward_mesh_info(k, info)
                except ValueError:
                    with pytest.raises(ValueError):
                        modern_fsdp.post_forward_size(k, n)
                    continue
                ours = modern_fsdp.post_forward_size(k, n)
                if isinstance(got, torch.Tensor):
                    smaller.append(k)
                    assert ours == k and tuple(got.shape) == (n // k, k)
                else:
                    assert ours is (got is info)
        assert smaller == modern_fsdp.accepted_int_sizes(n)
    assert modern_fsdp.accepted_int_sizes(64) == [2, 4, 8, 16, 32]
    assert modern_fsdp.accepted_int_sizes(2) == []


def test_activation_bytes_of_the_bucket_net():
    assert modern_fsdp.activation_bytes(8) == 4 * 8 * (64 + (130 + 128) + (130 + 256)
                                                      + (130 + 512) + 256) == 51392
    assert modern_fsdp.activation_bytes(8, checkpointed=True) == 4 * 8 * (64 + 3 * 64 + 256)
    assert modern_fsdp.activation_bytes(64) == 411136
    assert modern_fsdp.activation_bytes(64, checkpointed=True) == 131072
    with pytest.raises(ValueError, match="batch_size"):
        modern_fsdp.activation_bytes(0)


def test_recompute_flops_are_fc1_only():
    assert modern_fsdp.recompute_flops(64) == 2 * 64 * 64 * (128 + 256 + 512) == 7340032
    from torch.utils import checkpoint
    assert inspect.signature(checkpoint.checkpoint).parameters["use_reentrant"].default is None
    assert "early_stop: bool = True" in inspect.getsource(checkpoint._checkpoint_without_reentrant_generator)


def test_ddp_optimizer_buckets_split_from_the_last_layer():
    block = 4 * (512 * 512 + 512)
    head = 4 * (512 * 4 + 4)
    cap = modern_fsdp.BUCKET_CAP_MB * 2**20
    assert modern_fsdp.ddp_optimizer_buckets([block] * 4 + [head], cap) == \
        [block, block, block, block + head]
    # a larger cap: the first bucket still closes at torch's 1 MiB, the rest is one bucket
    assert modern_fsdp.ddp_optimizer_buckets([block] * 4 + [head], 25 * cap) == \
        [3 * block, block + head]
    assert modern_fsdp.ddp_optimizer_buckets([block] * 4 + [head], 25 * cap, 25 * cap) == \
        [4 * block + head]
    with pytest.raises(ValueError, match="cap"):
        modern_fsdp.ddp_optimizer_buckets([1], 0)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        modern_fsdp.ddp_optimizer_buckets([1], 2**19)
    assert modern_fsdp.FIRST_BUCKET_BYTES == torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def test_ddp_optimizer_refuses_a_cap_below_its_first_bucket():
    from torch._dynamo.backends.distributed import DDPOptimizer
    DDPOptimizer(bucket_bytes_cap=2**20, backend_compile_fn=lambda gm, _: gm)
    with pytest.raises(AssertionError, match="First bucket"):
        DDPOptimizer(bucket_bytes_cap=2**19, backend_compile_fn=lambda gm, _: gm)
    assert torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == 2**20


def _event(index, kind, phase, unit=None, collective=None):
    from dpbook.tracing.lifecycle import TraceEvent
    return TraceEvent(index, kind, phase, unit, collective)


def test_issue_order_reads_gathers_and_computes_of_one_pass():
    events = [_event(0, "step_begin", "rest"), _event(1, "forward_pre", "forward", 0),
              _event(2, "collective", "forward", 0, "all_gather"),
              _event(3, "collective", "forward", 1, "all_gather"),
              _event(4, "forward_compute", "forward", 0), _event(5, "forward_compute", "forward", 1),
              _event(6, "backward_pre", "backward", 1),
              _event(7, "collective", "backward", 0, "all_gather"),
              _event(8, "backward_post", "backward", 1),
              _event(9, "collective", "backward", 1, "reduce_scatter")]
    order = modern_fsdp.issue_order(events, "forward")
    assert order == [("AllGather", 0), ("AllGather", 1), ("compute", 0), ("compute", 1)]
    assert modern_fsdp.gathered_before(order, 0) == [0, 1]
    back = modern_fsdp.issue_order(events, "backward")
    assert back == [("AllGather", 0), ("done", 1)]
    assert modern_fsdp.gathered_before(back, 1, "done") == [0]
    with pytest.raises(ValueError, match="phase"):
        modern_fsdp.issue_order(events, "optimizer")


def _recompute_runs_frees_each_model(rank: int, world_size: int) -> int:
    """Rank function: ``recompute_runs`` with ``build_bucket_net`` wrapped so that building the
    second model fails while the first FSDP2 model is still alive (gpu-path review D12: on CUDA
    the checkpointing run's peak counted it)."""
    import weakref

    from dpbook import measure
    from dpbook.pages import modern_fsdp as page

    class CudaLikeProbe:  # the CUDA path reads counters; MemTracker (CPU) keeps modules alive itself
        method = "cuda"

        def __init__(self, *tracked):
            self.marks = []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def mark(self, tag):
            self.marks.append(tag)

        def relative(self):
            return {tag: 0 for tag in self.marks}

    def cuda_like_peak(run, *tracked):
        run()
        return measure.PeakMemory(0, "cuda")

    page.MemoryProbe, measure.peak_memory = CudaLikeProbe, cuda_like_peak
    built, real = [], page.build_bucket_net

    def tracked():
        alive = [i for i, ref in enumerate(built) if ref() is not None]
        if alive:
            raise AssertionError(f"mô hình FSDP2 số {alive} vẫn còn khi lần chạy sau bắt đầu")
        model = real()
        built.append(weakref.ref(model))
        return model

    page.build_bucket_net = tracked
    try:
        page.recompute_runs(rank, world_size, batch_size=8)
    finally:
        page.build_bucket_net = real
    return len(built)


@pytest.mark.distributed
def test_recompute_runs_frees_the_first_model_before_the_second():
    assert launch.spawn(_recompute_runs_frees_each_model, world_size=2, backend="gloo",
                        timeout=180, output="none") == [2, 2]
