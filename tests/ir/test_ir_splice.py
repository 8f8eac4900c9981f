"""ir.edit.splice_after and add_initializer: nodes inserted after a value take over its readers."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from support.numerics import assert_equal
from support.onnx_models import run_model

from onnxblocks.errors import InvalidValueError
from onnxblocks.ir import serde
from onnxblocks.ir.edit import add_initializer, splice_after
from onnxblocks.ir.names import graph_names


def _model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Neg", ["h"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_readers_and_graph_outputs_move_to_the_spliced_value():
    model = serde.from_proto(_model())
    graph = model.graph
    names = graph_names(graph)
    h = next(n for n in graph if n.name == "relu").outputs[0]
    offset = add_initializer(graph, "offset", np.full(3, 10.0, dtype=np.float32))
    out = ir.Value(name="h_plus", type=h.type, shape=h.shape)
    add = ir.Node("", "Add", [h, offset], outputs=[out], name="add")
    splice_after(h, [add], out, names)
    proto = serde.to_proto(model)
    assert [n.name for n in proto.graph.node] == ["relu", "add", "neg"]
    assert [o.name for o in proto.graph.output] == ["y", "h"]  # the graph output keeps its name
    y, h_out = run_model(proto, {"x": np.array([-1.0, 0.5, 2.0], dtype=np.float32)})
    # relu and the added offset are exact in float32
    assert_equal(h_out, np.array([10.0, 10.5, 12.0], np.float32), name="h")
    assert_equal(y, np.array([-10.0, -10.5, -12.0], np.float32), name="y")
    with pytest.raises(InvalidValueError, match="already has a value named 'offset'"):
        add_initializer(graph, "offset", np.zeros(1, dtype=np.float32))
    with pytest.raises(InvalidValueError, match="no producer"):
        splice_after(graph.inputs[0], [], ir.Value(name="z"), names)
