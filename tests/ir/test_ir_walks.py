"""The IR layer's protobuf-level helpers (walk, names, opset conversion) see inside subgraphs."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnxblocks.ir.names import proto_graph_names
from onnxblocks.ir.opset import convert_opset, fit_opset
from onnxblocks.ir.walk import proto_nodes


def _branch(op_type: str, name: str) -> onnx.GraphProto:
    node = helper.make_node(op_type, ["x"], [f"{name}_out"], name=name)
    return helper.make_graph(
        [node], name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])]
    )


def _model_with_if(inner_op: str, opset: int) -> onnx.ModelProto:
    nested = helper.make_node(
        "If", ["c"], ["y2"], then_branch=_branch(inner_op, "a"), else_branch=_branch("Relu", "b")
    )
    outer_then = helper.make_graph(
        [nested], "t", [], [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2])]
    )
    top = helper.make_node(
        "If", ["c"], ["y"], then_branch=outer_then, else_branch=_branch("Neg", "e"), name="top"
    )
    graph = helper.make_graph(
        [top],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_proto_nodes_is_depth_first_through_nested_subgraphs():
    model = _model_with_if("Sigmoid", 17)
    # helper.make_node stores attributes sorted by name: else_branch before then_branch
    assert [n.name for n in proto_nodes(model.graph)] == ["top", "e", "", "b", "a"]


def test_an_op_missing_at_the_target_is_named_even_inside_a_subgraph():
    model = _model_with_if("Gelu", 20)  # Gelu exists from opset 20 only
    with pytest.raises(
        ValueError, match=r"cannot be converted to opset 17.*do not exist there: Gelu\."
    ):
        convert_opset(model, 17)


def test_fit_opset_returns_a_supported_model_itself():
    model = _model_with_if("Sigmoid", 17)
    assert fit_opset(model) is model


def test_proto_graph_names_knows_subgraph_names():
    model = _model_with_if("Sigmoid", 17)
    names = proto_graph_names(model.graph)
    assert names.is_used("a_out") and names.is_used("y2") and names.is_used("top")
    assert names.fresh("a_out") == "a_out_0"
