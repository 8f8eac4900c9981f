"""A one-layer ONNX model and an ONNX Runtime runner, for tests and the ``conftest`` fixtures."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper


def run_model(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str] | None = None
) -> list:
    """Run a model through onnxruntime's InferenceSession."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


def make_linear_model(
    in_features: int = 8, out_features: int = 4, seed: int = 0, opset: int = 17
) -> onnx.ModelProto:
    """``y = x @ W + b``: a one-layer model with float inputs ``x: [N, in]`` and output ``y: [N, out]``."""
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array(
        rng.standard_normal((in_features, out_features)).astype(np.float32), "W"
    )
    b = onnx.numpy_helper.from_array(rng.standard_normal(out_features).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", in_features])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", out_features])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model
