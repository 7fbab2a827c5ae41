"""The starting point of the wrapping exercise: fill in ``boc``."""

from torch.distributed.fsdp import fully_shard  # noqa: F401  (what the learner will call)


def boc(model):
    """Apply ``fully_shard`` to ``model`` (a ``TinyTransformer``: ``model.embed``,
    ``model.blocks``, ``model.norm``, ``model.head``) and return it."""
    raise NotImplementedError("Hãy viết hàm boc: gọi fully_shard cho từng khối, rồi cho gốc.")
