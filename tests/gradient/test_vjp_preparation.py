"""The VJP graph's preparation on the IR: buffers written in place get copies; read outputs get an Identity."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper
from pass_oracle import check_pass, make_model, run, vi
from support.passes import on_proto

from onnxblocks.gradient.vjp import (
    CopyInputsWrittenInPlace,
    _give_outputs_their_own_writer,
    _sources,
)
from onnxblocks.ir.serde import from_proto, to_proto

copy_inputs_written_in_place = on_proto(CopyInputsWrittenInPlace)

RNG = np.random.default_rng(23)


def _batch_norm():
    node = helper.make_node(
        "BatchNormalization",
        ["x", "g", "b", "m", "v"],
        ["y", "m_out", "v_out"],
        training_mode=1,
        momentum=0.5,
    )
    inputs = [vi("x", [2, 3, 4])] + [vi(n, [3]) for n in "gbmv"]
    return make_model(
        [node], inputs, [vi("y", None), vi("m_out", None), vi("v_out", None)], opset=15
    )


def test_running_statistics_inputs_are_read_through_copies():
    feeds = {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)}
    feeds |= {n: (RNG.random(3) + 0.5).astype(np.float32) for n in "gbmv"}
    after = check_pass(CopyInputsWrittenInPlace(), _batch_norm(), feeds, {"BatchNormalization": 2})
    assert [n.op_type for n in after.graph.node] == ["Add", "Add", "BatchNormalization"]
    assert list(after.graph.node[-1].input[3:]) == ["m.copy_0", "v.copy_0"]
    assert sorted(i.name for i in after.graph.initializer) == ["m.zero_0", "v.zero_0"]


def test_the_proto_function_counts_and_is_idempotent_on_copies():
    model = _batch_norm()
    assert copy_inputs_written_in_place(model) == 2
    assert copy_inputs_written_in_place(model) == 0  # the node now reads copies, not graph inputs


def test_an_output_also_read_inside_a_subgraph_gets_its_own_identity():
    then = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [], [vi("t", None)])
    other = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["e"])], "else", [], [vi("e", None)]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero")]
    model = make_model(nodes, [vi("x", [3])], [vi("a", [3]), vi("y", [3])], inits)
    ir_model = from_proto(model)
    sources = _sources(ir_model.graph)
    assert sources["y"] == {"x"} and sources["a"] == {"x"}
    assert _give_outputs_their_own_writer(ir_model.graph, ["a"])
    after = to_proto(ir_model)
    assert after.graph.node[-1].op_type == "Identity" and list(after.graph.node[-1].output) == ["a"]
    inner = after.graph.node[3].attribute[0].g.node[0]
    assert list(inner.input) == ["a.value_0"]  # the subgraph reads the renamed value
    assert [o.name for o in after.graph.output] == ["a", "y"]
    x = np.array([1.0, -2.0, 3.0], np.float32)
    for got, want in zip(run(after, {"x": x}), run(model, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)
    assert not _give_outputs_their_own_writer(
        from_proto(after).graph, ["a"]
    )  # only the Identity reads it now
