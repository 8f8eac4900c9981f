"""RecurrentDirectionsAsForward and RecurrentAsElementary: the same sequences from forward-only or unrolled nodes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import check_pass, make_model, vi

from onnxblocks.gradient.recurrent import RecurrentAsElementary, RecurrentDirectionsAsForward

RNG = np.random.default_rng(11)
T, B, IN, H = 4, 2, 3, 5
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _recurrent(op, direction, elem=TensorProto.FLOAT, **attrs):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    dtype = np.float32 if elem == TensorProto.FLOAT else np.float64
    inits = [
        numpy_helper.from_array((0.5 * RNG.standard_normal((dirs, g * H, IN))).astype(dtype), "W"),
        numpy_helper.from_array((0.5 * RNG.standard_normal((dirs, g * H, H))).astype(dtype), "R"),
        numpy_helper.from_array((0.5 * RNG.standard_normal((dirs, 2 * g * H))).astype(dtype), "B"),
    ]
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(
        op, ["X", "W", "R", "B"], outputs, hidden_size=H, direction=direction, **attrs
    )
    model = make_model(
        [node], [vi("X", [T, B, IN], elem)], [vi(o, None, elem) for o in outputs], inits
    )
    x = RNG.standard_normal((T, B, IN)).astype(dtype)
    return model, {"X": x}


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_directions_become_forward_nodes(op, direction):
    model, feeds = _recurrent(op, direction)
    after = check_pass(RecurrentDirectionsAsForward(), model, feeds, {op: 1})
    kept = [n for n in after.graph.node if n.op_type == op]
    assert len(kept) == (2 if direction == "bidirectional" else 1)
    assert all(
        helper.get_attribute_value(a) == b"forward"
        for n in kept
        for a in n.attribute
        if a.name == "direction"
    )


@pytest.mark.parametrize(
    ("op", "elem"),
    [("RNN", TensorProto.FLOAT), ("GRU", TensorProto.DOUBLE), ("LSTM", TensorProto.DOUBLE)],
)
def test_unrolled_forward_node_keeps_its_values(op, elem):
    model, feeds = _recurrent(op, "forward", elem)
    double = elem == TensorProto.DOUBLE
    check_pass(
        RecurrentAsElementary(), model, feeds, {op: 1}, gone=op, before_with_reference=double
    )


def test_gru_with_linear_before_reset_unrolls_too():
    model, feeds = _recurrent("GRU", "forward", TensorProto.DOUBLE, linear_before_reset=1)
    check_pass(
        RecurrentAsElementary(), model, feeds, {"GRU": 1}, gone="GRU", before_with_reference=True
    )


def test_float32_gru_is_left_to_onnxruntime():
    model, feeds = _recurrent("GRU", "forward")
    check_pass(RecurrentAsElementary(), model, feeds, {})
