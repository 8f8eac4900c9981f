"""The float32 seed of a non-float32 loss: added as a Cast output on the IR, removed again after the build."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from pass_oracle import make_model, run, vi

from onnxblocks.gradient.signature import drop_float_seed, float_seed
from onnxblocks.ir.serde import from_proto, to_proto


def _double_loss():
    nodes = [helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0)]
    return make_model(
        nodes, [vi("x", [3], TensorProto.DOUBLE)], [vi("loss", [], TensorProto.DOUBLE)]
    )


def test_a_double_loss_gets_a_float32_cast_output_that_is_dropped_again():
    model = _double_loss()
    seed = float_seed(model, "loss")
    assert seed == "loss.float32_0"
    assert [o.name for o in model.graph.output] == ["loss", seed]
    assert model.graph.output[1].type.tensor_type.elem_type == TensorProto.FLOAT
    x = np.array([0.1, 0.2, 0.3])
    loss, cast = run(model, {"x": x})
    assert cast.dtype == np.float32 and cast == np.float32(loss) and loss == x.sum()
    ir_model = from_proto(model)  # ONNX Runtime's result is edited on the IR
    drop_float_seed(ir_model.graph, seed)
    model = to_proto(ir_model)
    assert [o.name for o in model.graph.output] == ["loss"]
    assert [n.op_type for n in model.graph.node] == ["ReduceSum"]


def test_a_float32_loss_is_its_own_seed():
    nodes = [helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0)]
    model = make_model(nodes, [vi("x", [3])], [vi("loss", [])])
    before = model.SerializeToString()
    assert float_seed(model, "loss") == "loss" and model.SerializeToString() == before
