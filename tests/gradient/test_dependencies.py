"""What depends on what, on the IR: differentiable paths, subgraph reads, and the checks before ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import make_model, vi

from onnxblocks._core.errors import GradientError
from onnxblocks.gradient.dependencies import (
    check_differentiable,
    downstream_values,
    upstream_values,
)
from onnxblocks.ir.serde import from_proto


def _graph():
    then = helper.make_graph([helper.make_node("Neg", ["h"], ["t"])], "then", [], [vi("t", None)])
    other = helper.make_graph(
        [helper.make_node("Identity", ["h"], ["e"])], "else", [], [vi("e", None)]
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Shape", ["h"], ["s"]),
        helper.make_node("Greater", ["h", "zero"], ["c"]),
        helper.make_node("ReduceMax", ["c"], ["any"], keepdims=0),
        helper.make_node("If", ["any"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero")]
    model = make_model(
        nodes,
        [vi("x", [2, 3]), vi("w", [3, 2])],
        [vi("loss", []), vi("s", None, TensorProto.INT64)],
        inits,
    )
    model.graph.node[3].op_type = "Cast"
    del model.graph.node[3].attribute[:]
    model.graph.node[3].attribute.append(helper.make_attribute("to", TensorProto.BOOL))
    return from_proto(model).graph


def _names(values):
    return {v.name for v in values}


def test_downstream_follows_subgraph_reads_and_stops_at_shapes_and_comparisons():
    graph = _graph()
    assert _names(downstream_values(graph, ["w"])) == {"w", "h", "y", "loss"}
    assert _names(downstream_values(graph, ["w"], differentiable=False)) == {
        "w",
        "h",
        "s",
        "c",
        "any",
        "y",
        "loss",
    }


def test_upstream_reaches_what_the_subgraph_reads():
    graph = _graph()
    assert _names(upstream_values(graph, ["y"])) == {
        "y",
        "any",
        "h",
        "x",
        "w",
    }  # the Cast to bool stops
    assert "zero" in _names(upstream_values(graph, ["loss"], differentiable=False))


def test_control_flow_reading_a_trained_value_is_refused_naming_the_node():
    with pytest.raises(
        GradientError, match=r"If node .* reads \['h'\], which depend on the trainable \['w'\]"
    ):
        check_differentiable(_graph(), ["w"], "loss")


def test_a_constant_loss_is_refused():
    graph = from_proto(
        make_model(
            [helper.make_node("Shape", ["x"], ["loss"])], [vi("x", [2])], [vi("loss", None, 7)]
        )
    ).graph
    with pytest.raises(GradientError, match="The loss 'loss' does not depend on any graph input"):
        check_differentiable(graph, [], "loss")
