"""The IR layer's editing units, one behaviour each: graph surgery (``ir.edit``), the node writer
(``ir.writer``), constant folding (``ir.folding``), types on values (``ir.types``) and the rewrite
base's reasons (``ir.rewrite``). Numbers are checked by running the edited graph with ONNX Runtime
against numpy in float64.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close, assert_equal

from onnxblocks._core.errors import InvalidValueError
from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir import types
from onnxblocks.ir.edit import (
    add_initializer,
    cut_to_outputs,
    remove_unused_nodes,
    rename_values,
    replace_node,
    values_by_name,
)
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.rewrite import NodeRewrite, fail
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.writer import Writer


def _model(nodes, inputs, outputs, inits=(), opset=17) -> ir.Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = to_proto(model)
    proto.ir_version = 8
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _chain() -> ir.Model:
    """y = Relu(x) * 2, and a dead Neg branch."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "two"], ["y"], name="mul"),
        helper.make_node("Neg", ["x"], ["dead"], name="neg"),
    ]
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    return _model(nodes, [_vi("x", [3])], [_vi("y", [3])], [two])


X = np.array([-1.5, 0.25, 3.0], np.float32)


# ------------------------------------------------------------------ ir.edit
def test_replace_node_hands_uses_and_name_to_the_new_output() -> None:
    model = _chain()
    relu = next(n for n in model.graph if n.op_type == "Relu")
    w = Writer(graph_names(model.graph), 17, "relu")
    w.op("Max", [relu.inputs[0], w.scalar(0.0)], out="r")
    replace_node(relu, w.nodes, [w.nodes[-1].outputs[0]])
    ops = [n.op_type for n in model.graph]
    assert "Relu" not in ops and ops.index("Max") < ops.index("Mul")
    mul = next(n for n in model.graph if n.op_type == "Mul")
    assert mul.inputs[0] is w.nodes[-1].outputs[0] and mul.inputs[0].name == "r"
    (y,) = _run(model, {"x": X})
    assert_close(
        y, np.maximum(X, 0) * np.float32(2), np.maximum(X.astype(np.float64), 0) * 2, rtol=1e-6
    )


def test_replace_node_refuses_to_drop_an_output_still_read() -> None:
    model = _chain()
    relu = next(n for n in model.graph if n.op_type == "Relu")
    with pytest.raises(InvalidValueError, match="'r'.*still read"):
        replace_node(relu, [], [None])


def test_remove_unused_nodes_drops_what_reaches_no_output_unless_kept() -> None:
    model = _chain()
    dead = values_by_name(model.graph)["dead"]
    assert remove_unused_nodes(model.graph, keep=[dead]) == 0
    assert remove_unused_nodes(model.graph) == 1
    assert [n.op_type for n in model.graph] == ["Relu", "Mul"]
    assert not values_by_name(model.graph)["x"].uses() or all(
        u.node.op_type == "Relu" for u in values_by_name(model.graph)["x"].uses()
    )


def test_cut_to_outputs_keeps_only_what_the_new_outputs_need() -> None:
    model = _chain()
    r = values_by_name(model.graph)["r"]
    cut_to_outputs(model.graph, [r])
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert "two" not in model.graph.initializers  # the Mul's constant went with it
    assert [v.name for v in model.graph.inputs] == ["x"]


def test_rename_values_renames_initializers_and_outputs_and_counts() -> None:
    model = _chain()
    assert rename_values(model.graph, {"two": "factor", "r": "relu_out", "absent": "z"}) == 2
    assert "factor" in model.graph.initializers and "two" not in model.graph.initializers
    names = values_by_name(model.graph)
    assert names["relu_out"].producer().op_type == "Relu"
    (y,) = _run(model, {"x": X})
    assert_close(
        y, np.maximum(X, 0) * np.float32(2), np.maximum(X.astype(np.float64), 0) * 2, rtol=1e-6
    )


def test_add_initializer_registers_an_inline_tensor() -> None:
    model = _chain()
    value = add_initializer(model.graph, "bias", np.arange(3, dtype=np.float32))
    assert model.graph.initializers["bias"] is value
    assert_equal(ConstantTable(model.graph).value(value), np.arange(3, dtype=np.float32))


# ------------------------------------------------------------------ ir.writer
@pytest.mark.parametrize("opset", [11, 13, 18])
def test_writer_spells_each_op_in_the_form_of_the_opset(opset: int) -> None:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 3]))
    w = Writer(NameAuthority(["x"]), opset, "t")
    u = w.unsqueeze(x, [0])
    s = w.reduce("ReduceMean", w.squeeze(u, [0]), [1], keepdims=0)
    node_of = {n.outputs[0]: n for n in w.nodes}
    unsqueeze, mean = node_of[u], node_of[s]
    assert (len(unsqueeze.inputs) == 2) == (opset >= 13)
    assert ("axes" in unsqueeze.attributes) == (opset < 13)
    assert (len(mean.inputs) == 2) == (opset >= 18)
    graph = ir.Graph([x], [s], nodes=w.nodes, opset_imports={"": opset})
    feed = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = _run(ir.Model(graph, ir_version=8), {"x": feed})
    assert_close(got, feed.mean(axis=1), feed.astype(np.float64).mean(axis=1), rtol=1e-6)


def test_writer_names_are_fresh_and_out_names_are_kept() -> None:
    names = NameAuthority(["x", "t.neg_0"])
    w = Writer(names, 17, "t")
    x = ir.Value(name="x")
    a = w.op("Neg", [x])
    b = w.op("Neg", [a], out="y")
    assert a.name not in ("x", "t.neg_0") and a.name.startswith("t.neg")
    assert b.name == "y"
    assert len({n.name for n in w.nodes}) == 2


def test_writer_refuses_run_time_axes_before_the_opset_that_takes_them() -> None:
    w = Writer(NameAuthority(), 13, "t")
    axes = ir.Value(name="axes")
    with pytest.raises(InvalidValueError, match="ReduceMean.*opset 18"):
        w.reduce("ReduceMean", ir.Value(name="x"), axes)


# ------------------------------------------------------------------ ir.folding
def test_constant_table_folds_shape_arithmetic_and_stops_at_run_time_values() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Shape", ["x"], ["tail"], start=1),
        helper.make_node("Gather", ["tail", "zero"], ["d"], axis=0),
        helper.make_node("Mul", ["d", "k"], ["dk"]),
        helper.make_node("Add", ["dk", "x_int"], ["runtime"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(3, np.int64), "k"),
    ]
    model = _model(
        nodes,
        [_vi("x", ["n", 5]), _vi("x_int", [], TensorProto.INT64)],
        [_vi("runtime", [], TensorProto.INT64), _vi("s", [2], TensorProto.INT64)],
        inits,
    )
    by_name = values_by_name(model.graph)
    plain = ConstantTable(model.graph)
    assert plain.folded(by_name["dk"]) is None  # no opset: plain constants only
    assert_equal(plain.value(by_name["k"]), np.array(3, np.int64))
    table = ConstantTable(model.graph, 17, types.ValueTypes.infer(model))
    assert_equal(table.folded(by_name["dk"]), np.array(15, np.int64))
    assert table.folded(by_name["s"]) is None  # the batch dim is symbolic
    assert_equal(table.folded(by_name["tail"]), np.array([5], np.int64))
    assert table.folded(by_name["runtime"]) is None


def test_constant_table_reads_constant_nodes_but_not_external_weights() -> None:
    const = helper.make_node(
        "Constant", [], ["c"], value_ints=[4, 5]
    )  # an attribute form other than a tensor
    model = _model([const, helper.make_node("Identity", ["c"], ["y"])], [], [_vi("y", [2])])
    c = values_by_name(model.graph)["c"]
    assert_equal(ConstantTable(model.graph).value(c), np.array([4, 5], np.int64))
    external = ir.Value(name="w")
    external.const_value = ir.ExternalTensor(
        "w.bin", offset=0, length=8, dtype=ir.DataType.FLOAT, shape=ir.Shape([2]), name="w"
    )
    model.graph.register_initializer(external)
    assert ConstantTable(model.graph).value(external) is None


# ------------------------------------------------------------------ ir.types
def test_inferred_types_live_on_the_values_and_one_reader_reads_them() -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Cast", ["h"], ["y"], to=TensorProto.DOUBLE),
    ]
    w = numpy_helper.from_array(np.zeros((4, 2), np.float32), "w")
    model = _model(nodes, [_vi("x", ["batch", 4])], [_vi("y", None, TensorProto.DOUBLE)], [w])
    h = values_by_name(model.graph)["h"]
    assert types.shape(h) is None and types.elem_type(h) is None  # nothing inferred yet
    types.infer_types(model)
    assert types.elem_type(h) == TensorProto.FLOAT and types.dtype(h) == np.float32
    assert types.dims(h) == ["batch", 2] and types.shape(h) == [None, 2]
    y = model.graph.outputs[0]
    assert types.dims(y) == ["batch", 2]  # the declared rank-less output got its inferred shape
    assert types.static_dims(types.shape(h)) is None and types.static_dims([3, 2]) == [3, 2]


def test_inference_never_loses_what_a_value_declares() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    x = model.graph.inputs[0]
    assert not types.set_type(x, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    assert types.shape(x) == [2, 3]
    assert types.set_type(ir.Value(name="z"), helper.make_tensor_type_proto(TensorProto.INT64, [1]))


def test_inference_leaves_no_type_on_a_value_it_cannot_type() -> None:
    unknown = helper.make_node("Unknown", ["x"], ["y"], domain="custom.domain")
    graph = helper.make_graph(
        [unknown], "g", [_vi("x", [2])], [helper.make_value_info("y", onnx.TypeProto())]
    )
    model = from_proto(
        helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.domain", 1)],
        )
    )
    types.infer_types(model)
    assert (
        types.elem_type(model.graph.outputs[0]) is None
        and types.shape(model.graph.outputs[0]) is None
    )


# ------------------------------------------------------------------ ir.rewrite
class _NegAsMul(NodeRewrite):
    """Neg(x) -> x * -1 for float32 inputs only, saying why otherwise."""

    name = "neg_as_mul"
    min_opset = None

    def select(self, node):
        return node.op_type == "Neg"

    def rewrite(self, node, ctx):
        if ctx.dtype(node.inputs[0]) != np.float32:
            return fail("the input is not float32")
        w = ctx.writer(node)
        w.op("Mul", [node.inputs[0], w.scalar(-1.0)], out=node.outputs[0].name)
        return w.nodes


def test_a_rewrite_that_does_not_apply_says_why() -> None:
    nodes = [helper.make_node("Neg", ["a"], ["y"]), helper.make_node("Neg", ["b"], ["z"])]
    model = _model(
        nodes,
        [_vi("a", [2]), _vi("b", [2], TensorProto.INT64)],
        [_vi("y", [2]), _vi("z", [2], TensorProto.INT64)],
    )
    rewrite = _NegAsMul()
    result = rewrite(model)
    assert result.changes == {"Neg": 1}
    assert [reason for _, reason in rewrite.misses] == ["the input is not float32"]
    assert not fail("any reason")
    a = np.array([1, -2], np.float32)
    y, z = _run(model, {"a": a, "b": np.array([3, -4], np.int64)})
    assert_close(y, a * np.float32(-1), a.astype(np.float64) * -1, rtol=1e-6)
    assert_equal(z, np.array([-3, 4], np.int64))
