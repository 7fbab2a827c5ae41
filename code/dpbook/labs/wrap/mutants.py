"""Wrong wrappings the checker must reject, each with the items it must fail (the page's hidden
cell and ``tests/labs/test_wrap.py`` run them)."""

import torch
from torch.distributed.fsdp import fully_shard


def root_only(model):
    fully_shard(model)
    return model


def blocks_only(model):
    for block in model.blocks:
        fully_shard(block)
    return model


def every_linear(model):
    for module in list(model.modules()):
        if isinstance(module, torch.nn.Linear):
            fully_shard(module)
    fully_shard(model)
    return model


def root_first(model):
    fully_shard(model)
    for block in model.blocks:
        fully_shard(block)
    return model


MUTANTS = {"root_only": root_only, "blocks_only": blocks_only, "every_linear": every_linear,
           "root_first": root_first}
EXPECTED = {"root_only": {"khoi", "so-don-vi", "allgather"},
            "blocks_only": {"goc", "so-don-vi", "gradient"},
            "every_linear": {"khoi", "so-don-vi"},
            "root_first": {"chay"}}
