"""NodeRewrite and the IR helpers it reads: inferred types, constant folding, typed attributes."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import check_pass, make_model, vi
from support.passes import on_proto

from onnxblocks._core.weights import make_stub
from onnxblocks.ir import attributes
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.rewrite import NodeRewrite
from onnxblocks.ir.serde import from_proto
from onnxblocks.ir.types import ValueTypes


class _ReluAsMax(NodeRewrite):
    """Relu(x) -> Max(x, 0): a rewrite to test the machinery with."""

    name = "relu_as_max"
    min_opset = None

    def select(self, node):
        return node.op_type == "Relu"

    def rewrite(self, node, ctx):
        dtype = ctx.dtype(node.inputs[0])
        if dtype is None:
            return None
        w = ctx.writer(node.outputs[0].name)
        w.op("Max", [node.inputs[0], w.const(0, dtype)], out=node.outputs[0].name)
        return w.nodes


def _chain():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, [vi("x", [4])], [vi("y", [4])])


def test_chained_rewrites_are_rewired_through_def_use_chains():
    x = np.array([-2, -0.5, 0.5, 3], np.float32)
    after = check_pass(_ReluAsMax(), _chain(), {"x": x}, {"Relu": 2}, gone="Relu")
    ops = [n.op_type for n in after.graph.node]
    assert ops == ["Constant", "Max", "Constant", "Max"]
    assert [n.output[0] for n in after.graph.node if n.op_type == "Max"] == ["a", "y"]


def test_on_proto_gives_the_count_and_edits_in_place():
    relu_as_max = on_proto(_ReluAsMax, "relu_as_max", "doc")
    model = _chain()
    assert relu_as_max.__name__ == "relu_as_max" and relu_as_max(model) == 2
    assert "Relu" not in {n.op_type for n in model.graph.node}
    assert relu_as_max(model) == 0


def test_min_opset_skips_the_whole_pass():
    class Late(_ReluAsMax):
        min_opset = 99

    model = from_proto(_chain())
    assert not Late()(model).modified


def test_value_types_read_inference_without_changing_the_graph():
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=TensorProto.DOUBLE),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    model = from_proto(make_model(nodes, [vi("x", ["N", 3])], [vi("y", None, TensorProto.DOUBLE)]))
    types = ValueTypes.infer(model)
    (cast, relu) = list(model.graph)
    assert (
        types.elem(cast.outputs[0]) == TensorProto.DOUBLE
        and types.dtype(relu.outputs[0]) == np.float64
    )
    assert types.shape(relu.outputs[0]) == [None, 3]
    assert cast.outputs[0].type is None  # the graph itself is unchanged


def test_constants_fold_with_numpy_and_with_the_reference_evaluator():
    nodes = [
        helper.make_node(
            "Constant", [], ["k"], value=numpy_helper.from_array(np.array([2, 3], np.int64))
        ),
        helper.make_node("Unsqueeze", ["k", "zero"], ["u"]),
        helper.make_node("Mul", ["k", "k"], ["m"]),
        helper.make_node("Shape", ["x"], ["s"], start=1),
        helper.make_node("Add", ["x", "x"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero")]
    model = from_proto(make_model(nodes, [vi("x", ["N", 5, 6])], [vi("y", None)], inits))
    values = {v.name: v for n in model.graph for v in n.outputs}
    table = ConstantTable(model.graph, 17, ValueTypes.infer(model))
    assert table.folded(values["u"]).tolist() == [[2, 3]]
    assert table.folded(values["m"]).tolist() == [4, 9]
    assert table.folded(values["s"]).tolist() == [5, 6]
    assert table.folded(values["y"]) is None
    assert ConstantTable(model.graph).folded(values["m"]) is None  # no opset: plain constants only
    assert ConstantTable(model.graph).value(values["k"]).tolist() == [2, 3]


def test_held_weights_are_never_constants():
    stub = make_stub("W", TensorProto.FLOAT, [2])
    model = from_proto(
        make_model([helper.make_node("Relu", ["W"], ["y"])], [], [vi("y", [2])], [stub])
    )
    assert ConstantTable(model.graph, 17).folded(model.graph.initializers["W"]) is None


def test_typed_attributes_name_the_node_when_wrong():
    node = ir.Node(
        "",
        "Foo",
        [],
        [ir.AttrInt64("k", 3), ir.AttrString("s", "x"), ir.AttrFloat32("f", 0.5)],
        name="n",
    )
    assert attributes.int_attribute(node, "k") == 3 and attributes.float_attribute(node, "k") == 3.0
    assert attributes.string_attribute(node, "s") == "x" and attributes.ints_attribute(
        node, "absent", [1]
    ) == [1]
    assert (
        attributes.value(node, "f") == 0.5
        and attributes.int_attribute(node, "absent", None) is None
    )
    with pytest.raises(ValueError, match="Node 'n' \\(Foo\\) has no attribute 'absent'"):
        attributes.int_attribute(node, "absent")
    with pytest.raises(ValueError, match="attribute 's' should be an int"):
        attributes.int_attribute(node, "s")
