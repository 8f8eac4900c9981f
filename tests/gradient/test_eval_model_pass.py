"""DisableTrainingMode: Dropout passes its input through, BatchNormalization uses its running statistics."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from pass_oracle import make_model, run, vi
from support.numerics import assert_close
from support.passes import on_proto

from onnxblocks.gradient.eval_model import DisableTrainingMode
from onnxblocks.ir.serde import from_proto, to_proto

disable_training_mode = on_proto(DisableTrainingMode)

RNG = np.random.default_rng(19)


def _model():
    flag = helper.make_node("Constant", [], ["flag"], value=numpy_helper.from_array(np.array(True)))
    nodes = [
        flag,
        helper.make_node("Dropout", ["x", "ratio", "flag"], ["d"]),
        helper.make_node(
            "BatchNormalization",
            ["d", "g", "b", "m", "v"],
            ["y", "m_out", "v_out"],
            training_mode=1,
            epsilon=1e-5,
        ),
        helper.make_node("Mul", ["m_out", "v_out"], ["mv"]),
    ]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "ratio")] + [
        numpy_helper.from_array(a.astype(np.float32), n)
        for n, a in (
            ("g", RNG.random(3) + 0.5),
            ("b", RNG.standard_normal(3)),
            ("m", RNG.standard_normal(3)),
            ("v", RNG.random(3) + 0.5),
        )
    ]
    return make_model(
        nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4]), vi("mv", [3])], inits, opset=15
    )


def test_eval_mode_uses_running_statistics_and_no_dropout():
    model = _model()
    params = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    ir_model = from_proto(model)
    assert dict(DisableTrainingMode()(ir_model).changes) == {"Dropout": 1, "BatchNormalization": 1}
    after = to_proto(ir_model)
    assert "Constant" not in {n.op_type for n in after.graph.node}  # the orphaned flag is gone
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    y, mv = run(after, {"x": x})
    g, b, m, v = (params[k].reshape(1, 3, 1) for k in "gbmv")
    g64, b64, m64, v64, x64 = (a.astype(np.float64) for a in (g, b, m, v, x))
    want = g * (x - m) / np.sqrt(v + np.float32(1e-5)) + b
    want64 = g64 * (x64 - m64) / np.sqrt(v64 + 1e-5) + b64
    scale = np.abs(g64) * (np.abs(x64) + np.abs(m64)) / np.sqrt(v64 + 1e-5) + np.abs(
        b64
    )  # the terms' magnitude
    assert_close(y, want, want64, rtol=1e-5, scale=scale, name="y: inference BatchNormalization")
    mv64 = params["m"].astype(np.float64) * params["v"]
    assert_close(
        mv, params["m"] * params["v"], mv64, rtol=1e-6, name="the running statistics passed through"
    )


def test_the_proto_function_skips_models_without_those_ops():
    plain = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3], TensorProto.FLOAT)], [vi("y", [3])]
    )
    before = plain.SerializeToString()
    assert disable_training_mode(plain) == 0 and plain.SerializeToString() == before
    model = _model()
    assert disable_training_mode(model) == 2 and disable_training_mode(model) == 0
