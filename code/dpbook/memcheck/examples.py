"""Models for ``python -m dpbook.memcheck``: each function returns ``(model, batch)``.

``book_mlp``: the book's small MLP (``models.build_mlp``: blocks of Linear + ReLU, a head owned
by the root module) with a batch of 8 samples, the model every page measures.
"""

from __future__ import annotations


def book_mlp():
    import torch

    from ..models import build_mlp

    model = build_mlp()
    batch = torch.randn(8, model.blocks[0].linear.in_features,
                        generator=torch.Generator().manual_seed(0))
    return model, batch
