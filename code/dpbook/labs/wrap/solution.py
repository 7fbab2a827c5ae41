"""A solution of the wrapping exercise: one unit per block, then the root."""

from torch.distributed.fsdp import fully_shard


def boc(model):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model
