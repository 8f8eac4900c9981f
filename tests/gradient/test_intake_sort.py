"""Sorting a model's nodes on the IR: stable, subgraph reads included, cycles named."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from pass_oracle import make_model, run, vi

from onnxblocks.gradient.intake import is_sorted, sort_topologically


def test_out_of_order_nodes_are_sorted_and_compute_the_same():
    nodes = [
        helper.make_node("Relu", ["a"], ["y"], name="last"),
        helper.make_node("Neg", ["x"], ["a"], name="first"),
        helper.make_node("Abs", ["x"], ["z"], name="free"),
    ]
    model = make_model(nodes, [vi("x", [3])], [vi("y", [3]), vi("z", [3])])
    assert not is_sorted(model.graph)
    assert sort_topologically(model.graph) == 2
    assert [n.name for n in model.graph.node] == ["first", "last", "free"]
    assert is_sorted(model.graph) and sort_topologically(model.graph) == 0
    x = np.array([1.0, -2.0, 3.0], np.float32)
    y, z = run(model, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(-x, 0))
    np.testing.assert_array_equal(z, np.abs(x))


def test_a_value_read_inside_a_subgraph_must_be_produced_first():
    then = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [], [vi("t", None)])
    other = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["e"])], "else", [], [vi("e", None)]
    )
    nodes = [
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch"),
        helper.make_node("Relu", ["x"], ["a"], name="producer"),
    ]
    inits = [numpy_helper.from_array(np.array(True), "c")]
    model = make_model(nodes, [vi("x", [2])], [vi("y", [2])], inits)
    assert not is_sorted(model.graph)
    assert sort_topologically(model.graph) == 2
    assert [n.name for n in model.graph.node] == ["producer", "branch"]
    np.testing.assert_array_equal(
        run(model, {"x": np.array([1.0, -1.0], np.float32)})[0], [-1.0, 0.0]
    )


def test_a_cycle_is_refused_naming_its_nodes():
    nodes = [
        helper.make_node("Neg", ["b"], ["a"], name="one"),
        helper.make_node("Neg", ["a"], ["b"], name="two"),
    ]
    model = make_model(nodes, [], [vi("a", [1])])
    with pytest.raises(ValueError, match=r"read each other in a cycle.*\['one', 'two'\]"):
        sort_topologically(model.graph, "the model")
