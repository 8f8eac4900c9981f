"""The split passes of ``onnxblocks.gradient.dynamic_split``, and the refusal of a gradient sequences would drop.

* ``SplitToSequence`` by a run-time chunk length or list of lengths becomes ``Slice`` nodes with the same values;
* a ``Split`` with an unused output becomes ``Slice`` nodes;
* a weight whose values reach the outputs only through sequence ops is refused, naming them, rather than
  given no gradient.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import run

from onnxblocks.errors import GradientError
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.gradient.dynamic_split import PartlyUsedSplitAsSlice, SplitToSequenceAsSlice
from onnxblocks.ir.serde import from_proto, to_proto

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _apply(pass_, model):
    ir_model = from_proto(model)
    changes = pass_(ir_model).changes
    return to_proto(ir_model), changes


@pytest.mark.parametrize("lengths", [None, [1, 4]])
def test_split_to_sequence_by_run_time_lengths_as_slice(lengths):
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    split_value = np.array(2 if lengths is None else lengths, dtype=np.int64)
    split_shape = [] if lengths is None else [2]
    nodes = [
        helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=0),
        helper.make_node("SequenceAt", ["seq", "zero"], ["a"]),
        helper.make_node("SequenceAt", ["seq", "one"], ["b"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("split", TensorProto.INT64, split_shape)],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["p", 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["q", 3])],
        inits,
    )  # fmt: skip
    rewritten, changes = _apply(SplitToSequenceAsSlice(), model)
    assert changes == {"SplitToSequence": 1}
    assert not {n.op_type for n in rewritten.graph.node} & {"SplitToSequence", "SequenceAt"}
    feeds = {"x": x, "split": split_value}
    for got, expected in zip(run(rewritten, feeds), run(model, feeds), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_partly_used_split_as_slice():
    x = RNG.standard_normal((2, 7)).astype(np.float32)
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 1])],
    )
    rewritten, changes = _apply(PartlyUsedSplitAsSlice(), model)
    assert changes == {"Split": 1}
    assert [n.op_type for n in rewritten.graph.node if n.op_type != "Constant"] == ["Slice"]
    np.testing.assert_array_equal(run(rewritten, {"x": x})[0], x[:, 6:])


def test_a_gradient_only_sequences_carry_is_refused():
    """A piece read at a run-time position stays a sequence op: refused, not a silently zero gradient."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("SplitToSequence", ["h", "split"], ["seq"], axis=0),
        helper.make_node("SequenceAt", ["seq", "position"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("split", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("position", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["p", 3])],
        [numpy_helper.from_array(RNG.standard_normal((3, 3)).astype(np.float32), "w")],
    )  # fmt: skip
    onnx.checker.check_model(model)
    with pytest.raises(GradientError, match="its gradient would silently be zero"):
        build_vjp_graph(model, requires_grad=["w"], outputs=["y"])
