"""LayerNormalization passes: an explicit zero bias, the statistics outputs, constant scales made initializers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from pass_oracle import check_pass, make_model, run, vi
from support.numerics import assert_equal

from onnxblocks.gradient.layer_norm import (
    ExposeLayerNormStatistics,
    LayerNormZeroBias,
    unshare_norm_constants,
)
from onnxblocks.ir.serde import from_proto, to_proto

RNG = np.random.default_rng(3)


def unshare_layer_norm_constants(model: onnx.ModelProto) -> set[str]:
    """The builder's step on the IR, run on a ModelProto in place (written back only when changed)."""
    ir_model = from_proto(model)
    lifted, changed = unshare_norm_constants(ir_model.graph)
    if changed:
        model.CopyFrom(to_proto(ir_model))
    return lifted


X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def _layer_norm(x_shape, scale_shape=(4,), axis=-1):
    scale = numpy_helper.from_array(RNG.standard_normal(scale_shape).astype(np.float32), "scale")
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=axis)
    return make_model([node], [vi("x", x_shape)], [vi("y", x_shape)], [scale])


def test_zero_bias_is_a_constant_of_the_normalised_shape():
    after = check_pass(
        LayerNormZeroBias(), _layer_norm([2, 3, 4]), {"x": X}, {"LayerNormalization": 1}
    )
    norm = after.graph.node[-1]
    assert norm.op_type == "LayerNormalization" and len(norm.input) == 3
    (bias,) = [n for n in after.graph.node if n.output[0] == norm.input[2]]
    assert numpy_helper.to_array(bias.attribute[0].t).tolist() == [0.0] * 4


def test_zero_bias_of_a_dynamic_shape_follows_the_scale():
    model = _layer_norm(["N", "T", "D"])
    model.graph.initializer.pop()
    model.graph.input.append(vi("scale", ["D"]))
    scale = RNG.standard_normal(4).astype(np.float32)
    after = check_pass(
        LayerNormZeroBias(), model, {"x": X, "scale": scale}, {"LayerNormalization": 1}
    )
    assert [n.op_type for n in after.graph.node] == [
        "Shape",
        "ConstantOfShape",
        "LayerNormalization",
    ]


def test_statistics_outputs_get_fresh_names():
    model = _layer_norm([2, 3, 4])
    after = check_pass(ExposeLayerNormStatistics(), model, {"x": X}, {"LayerNormalization": 1})
    assert list(after.graph.node[0].output) == ["y", "y.mean_0", "y.inv_std_dev_0"]
    check_pass(ExposeLayerNormStatistics(), after, {"x": X}, {})


def test_shared_constant_scales_become_initializers_to_lift():
    scale = helper.make_node(
        "Constant", [], ["s"], value=numpy_helper.from_array(np.full(4, 2.0, np.float32))
    )
    nodes = [
        scale,
        helper.make_node("LayerNormalization", ["x", "s"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "s"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])])
    want = run(model, {"x": X})
    lifted = unshare_layer_norm_constants(model)
    assert lifted == {"s"}
    assert [i.name for i in model.graph.initializer] == ["s"]
    assert [n.op_type for n in model.graph.node] == [
        "LayerNormalization"
    ] * 2  # readers: gradient/frozen_reads
    assert_equal(run(model, {"x": X})[0], want[0])  # the same nodes on the same values


def test_an_initializer_scale_is_lifted_and_a_model_without_norms_is_untouched():
    model = _layer_norm([2, 3, 4])
    model.graph.node.append(helper.make_node("LayerNormalization", ["y", "scale"], ["z"]))
    model.graph.output[0].name = "z"
    assert unshare_layer_norm_constants(model) == {"scale"}  # an initializer: lifted
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization"] * 2
    plain = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])])
    before = plain.SerializeToString()
    assert unshare_layer_norm_constants(plain) == set()
    assert plain.SerializeToString() == before
    assert isinstance(model, onnx.ModelProto)
