"""Which optimizer models the runtime drives itself, and in which parameter order.

An optimizer model in standard ops carries its ``OptimizerSpec`` as metadata; the order comes from
that spec, read by ``portable.optimizer.read_optimizer``. ONNX Runtime's own optimizer models carry
none and go to its ``Optimizer``. Metadata that cannot be read names the file and says to regenerate.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import helper

from onnxblocks._core.contracts import OPTIMIZER_METADATA
from onnxblocks.errors import InvalidValueError
from onnxblocks.portable.optimizer_spec import OptimizerSpec
from onnxblocks.runtime.optimizer_driver import standard_optimizer_order

PATH = Path("artifacts/optimizer_model.onnx")


def _model(meta: str | None) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph([], "optimizer", [], []))
    if meta is not None:
        helper.set_model_props(model, {OPTIMIZER_METADATA: meta})
    return model


def test_the_order_is_the_specs_parameter_order():
    group = {"hyper": {"momentum": 0.9}, "lr_scale": 1.0}
    spec = OptimizerSpec("sgd", (group, {**group, "lr_scale": 2.0}), (("w", 0), ("b", 1), ("a", 0)))
    assert standard_optimizer_order(PATH, _model(spec.to_json())) == ["w", "b", "a"]


def test_onnx_runtimes_own_optimizer_models_are_not_driven_here():
    assert standard_optimizer_order(PATH, _model(None)) is None


@pytest.mark.parametrize(
    "meta",
    [
        "{not json",
        '{"algorithm": "sgd", "groups": [{"hyper": {}, "lr_scale": 1.0}]}',
        '{"algorithm": "sgd", "groups": [{"hyper": {}, "lr_scale": 1.0}], "params": [["w", 3]]}',
    ],
    ids=["not-json", "no-params", "unknown-group"],
)
def test_unreadable_metadata_names_the_file_and_says_to_regenerate(meta):
    with pytest.raises(InvalidValueError, match="Regenerate the artifacts") as info:
        standard_optimizer_order(PATH, _model(meta))
    assert str(PATH) in str(info.value) and OPTIMIZER_METADATA in str(info.value)
