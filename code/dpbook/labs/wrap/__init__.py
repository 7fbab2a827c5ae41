"""Bài tập bọc FSDP (objective 3 of the chapter: configure FSDP's wrapping): the learner writes
``boc(model)``, which applies ``fully_shard`` to a ``TinyTransformer`` so that each block is one
unit and the root keeps the rest; ``checker.check(boc)`` runs it on 2 ranks and judges the units,
the AllGathers of one forward pass and the gradients against an unsharded model."""
