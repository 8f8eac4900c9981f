"""A model whose large constant is not a parameter: the held-weights tests keep it out of ONNX Runtime."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def model_with_big_constant():
    """``loss = sum(x @ (W * mask))``: a 4 KiB parameter ``W`` and a 4 KiB constant ``mask``; returns model, W, mask."""
    rng = np.random.default_rng(0)
    mask = (rng.uniform(size=(32, 32)) > 0.5).astype(np.float32)  # 4 KiB constant, not a parameter
    weight = rng.standard_normal((32, 32)).astype(np.float32)  # 4 KiB parameter
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["W", "mask"], ["mw"]),
            helper.make_node("MatMul", ["x", "mw"], ["y"]),
            helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [
            numpy_helper.from_array(np.asarray(weight), "W"),
            numpy_helper.from_array(np.asarray(mask), "mask"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weight, mask
