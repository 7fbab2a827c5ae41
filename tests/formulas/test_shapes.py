"""Model shapes: parameter counts from the architecture, and the FSDP units of each preset
(the largest layer, and what the root unit keeps when only the layers are wrapped)."""

import pytest

from dpbook import shapes
from dpbook.models import MLP, num_params


def test_llama_root_unit_is_embedding_final_norm_and_untied_head():
    s = shapes.SHAPES["llama-7b"][1]
    p = shapes.presets()["llama-7b"]
    assert p.root_unit == shapes.root_params(s) == 2 * 32000 * 4096 + 4096 == 262_148_096
    assert p.largest_unit == shapes.layer_params(s) == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert p.root_unit > p.largest_unit  # the root is bigger than any layer
    assert p.num_params == p.root_unit + s.layers * p.largest_unit


def test_gpt2_root_unit_has_the_tied_embedding_once():
    s = shapes.SHAPES["gpt2-124m"][1]
    assert shapes.root_params(s) == 50257 * 768 + 1024 * 768 + 2 * 768
    assert shapes.presets()["gpt2-124m"].root_unit == shapes.root_params(s)


def test_mlp_root_unit_is_its_head():
    p = shapes.presets()["mlp"]
    model = MLP()
    assert p.root_unit == num_params(model.head) == 32 * 4 + 4 == 132
    assert p.largest_unit == max(num_params(b) for b in model.blocks) == 1056


@pytest.mark.parametrize("key", sorted(shapes.SHAPES))
def test_root_unit_matches_the_meta_model(key):
    s = shapes.SHAPES[key][1]
    model = shapes.meta_model(s)
    in_layers = sum(num_params(m) for m in model if isinstance(m, type(model)))  # ModuleLists
    assert num_params(model) - in_layers == shapes.presets()[key].root_unit
