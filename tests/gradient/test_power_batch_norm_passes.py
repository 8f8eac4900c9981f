"""PowExponentAsExpLog and BatchNormInferenceAsElementary: the same values through exp/log and elementary ops."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import check_pass, make_model, vi
from support.passes import on_proto

from onnxblocks._core.errors import GradientError
from onnxblocks.gradient.batch_norm import BatchNormInferenceAsElementary
from onnxblocks.gradient.power import PowExponentAsExpLog
from onnxblocks.ir.serde import from_proto


def pow_exponent_as_exp_log(model, requires_grad):
    return on_proto(lambda: PowExponentAsExpLog(list(requires_grad)), "pow_exponent_as_exp_log")(
        model
    )


RNG = np.random.default_rng(29)


def _pow(elem=TensorProto.FLOAT):
    dtype = np.float32 if elem == TensorProto.FLOAT else np.float64
    nodes = [helper.make_node("Mul", ["e", "k"], ["b"]), helper.make_node("Pow", ["a", "b"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1.0, dtype), "k")]
    model = make_model(nodes, [vi("a", [8], elem), vi("e", [8], elem)], [vi("y", [8], elem)], inits)
    a = np.array([2.0, 0.5, 0.0, 0.0, 0.0, -2.0, -2.0, -1.5], dtype)
    e = np.array([1.5, -2.0, 2.0, 0.0, -1.0, 3.0, 2.0, 0.5], dtype)
    return model, {"a": a, "e": e}


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_pow_with_a_trained_exponent_is_exp_of_log(elem):
    model, feeds = _pow(elem)
    after = check_pass(PowExponentAsExpLog(["e"]), model, feeds, {"Pow": 1}, rtol=1e-6)
    assert {"Exp", "Log"} <= {n.op_type for n in after.graph.node}


def test_pow_whose_exponent_needs_no_gradient_stays():
    model, feeds = _pow()
    check_pass(PowExponentAsExpLog(["a"]), model, feeds, {})  # only the base is trained
    check_pass(PowExponentAsExpLog([]), model, feeds, {})
    assert pow_exponent_as_exp_log(model, ["e"]) == 1 and pow_exponent_as_exp_log(model, ["e"]) == 0


def test_inference_batch_norm_becomes_elementary_and_its_statistics_outputs_read_the_inputs():
    node = helper.make_node(
        "BatchNormalization", ["x", "g", "b", "m", "v"], ["y", "mo", "vo"], epsilon=1e-3
    )
    params = [
        numpy_helper.from_array(a.astype(np.float32), n)
        for n, a in (
            ("g", RNG.random(3) + 0.5),
            ("b", RNG.standard_normal(3)),
            ("m", RNG.standard_normal(3)),
        )
    ]
    model = make_model(
        [node, helper.make_node("Add", ["mo", "vo"], ["s"])],
        [vi("x", ["N", 3, 2, 2]), vi("v", [3])],
        [vi("y", None), vi("s", None)],
        params,
        opset=9,
    )
    feeds = {
        "x": RNG.standard_normal((2, 3, 2, 2)).astype(np.float32),
        "v": (RNG.random(3) + 0.5).astype(np.float32),
    }
    model.opset_import[0].version = 14
    del model.graph.node[0].output[1:]  # ONNX Runtime runs inference BatchNorm with one output only
    model.graph.node[1].op_type = "Identity"
    del model.graph.node[1].input[1:]
    model.graph.node[1].input[0] = "v"
    check_pass(
        BatchNormInferenceAsElementary(),
        model,
        feeds,
        {"BatchNormalization": 1},
        gone="BatchNormalization",
    )


def test_batch_norm_of_unknown_rank_is_refused():
    node = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"])
    model = make_model([node], [vi("x", None)] + [vi(n, [3]) for n in "gbmv"], [vi("y", None)])
    with pytest.raises(GradientError, match="whose rank is unknown"):
        BatchNormInferenceAsElementary()(from_proto(model))
