"""The portable eval model computes exporters' float64 arithmetic of constants once, at export.

torch's attention export writes ``Cast(Sqrt(Constant<double>))`` for its query/key scale;
onnxruntime-web's native WebGPU bundle has no float64 kernel and refused such a model ("Provider
type for Sqrt node ... is not set"). ``portable_eval_model`` folds the chain into the float32
constant it yields: the same outputs, no float64 left, the caller's model unchanged; float64
that a graph input reaches is not constant and stays.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close

from onnxblocks._core import ort
from onnxblocks.portable.make import portable_eval_model

HEAD_DIM = 16.0


def _scaled_model(extra_float64_input: bool = False) -> onnx.ModelProto:
    """``y = x * Cast<float>(Sqrt(Constant<double>(1/sqrt(16))))``, the shape of torch's export
    (two readers of one float64 constant, as two layers share it); optionally
    ``z = Cast<float>(Sqrt(d))`` of a float64 graph input ``d``.
    """
    scale = numpy_helper.from_array(np.array(1 / np.sqrt(HEAD_DIM), dtype=np.float64))
    nodes = [
        helper.make_node("Constant", [], ["c"], value=scale, name="scale"),
        helper.make_node("Sqrt", ["c"], ["s0"], name="Sqrt"),
        helper.make_node("Sqrt", ["c"], ["s1"], name="Sqrt_1"),
        helper.make_node("Cast", ["s0"], ["f0"], to=TensorProto.FLOAT, name="Cast"),
        helper.make_node("Cast", ["s1"], ["f1"], to=TensorProto.FLOAT, name="Cast_1"),
        helper.make_node("Mul", ["x", "f0"], ["q"], name="q"),
        helper.make_node("Mul", ["q", "f1"], ["y"], name="y"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]
    if extra_float64_input:
        nodes += [
            helper.make_node("Sqrt", ["d"], ["sd"], name="Sqrt_d"),
            helper.make_node("Cast", ["sd"], ["z"], to=TensorProto.FLOAT, name="Cast_d"),
        ]
        inputs.append(helper.make_tensor_value_info("d", TensorProto.DOUBLE, [2]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2]))
    graph = helper.make_graph(nodes, "scaled", inputs, outputs)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def _float64_nodes(model: onnx.ModelProto) -> list[str]:
    return [
        n.name
        for n in model.graph.node
        if (n.op_type == "Constant" and n.attribute[0].t.data_type == TensorProto.DOUBLE)
        or n.op_type == "Sqrt"
    ]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def test_the_float64_scale_becomes_its_float32_constant_with_the_same_outputs():
    model = _scaled_model()
    before = model.SerializeToString()
    portable = portable_eval_model(model)
    assert model.SerializeToString() == before  # the caller's model is not changed
    assert _float64_nodes(portable) == []
    assert [n.op_type for n in portable.graph.node].count("Constant") == 2
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (got,) = _run(portable, {"x": x})
    (was,) = _run(model, {"x": x})
    assert np.array_equal(got, was)  # the same float32 constants: bit for bit
    factor = np.sqrt(1 / np.sqrt(HEAD_DIM))
    assert_close(
        got, x * np.float32(factor) * np.float32(factor), x.astype(np.float64) * factor**2,
        rtol=1e-6, scale=np.abs(x), name="x * scale",
    )  # fmt: skip


def test_float64_from_a_graph_input_is_not_constant_and_stays():
    portable = portable_eval_model(_scaled_model(extra_float64_input=True))
    assert _float64_nodes(portable) == ["Sqrt_d"]
