"""The graphs behind onnxblocks.torch: build_vjp_graph, split_vjp_graph and the inference BatchNorm pass.

Checked numerically with ONNX Runtime against closed forms (numpy, in float32 and float64; ``support.numerics``);
no torch here.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from support.numerics import assert_close
from support.passes import on_proto

from onnxblocks.gradient import build_vjp_graph, split_vjp_graph
from onnxblocks.gradient.batch_norm import BatchNormInferenceAsElementary

batch_norm_inference_as_elementary = on_proto(BatchNormInferenceAsElementary)

F = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _two_outputs():
    """y = tanh(x @ W), z = y * y: the output y is also read by a node."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    model = _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Tanh", ["h"], ["y"]),
            helper.make_node("Mul", ["y", "y"], ["z"]),
        ],
        [helper.make_tensor_value_info("x", F, ["N", 4])],
        [
            helper.make_tensor_value_info("y", F, ["N", 3]),
            helper.make_tensor_value_info("z", F, ["N", 3]),
        ],
        [numpy_helper.from_array(w, "W")],
    )
    return model, w


def _expected(x, w, gy, gz):
    y = np.tanh(x @ w)
    dh = (gy + 2 * y * gz) * (1 - y * y)
    return y, y * y, dh @ w.T, x.T @ dh


def _check(actual: list, x, w, gy, gz) -> None:
    """``y, z, x_grad, w_grad`` (or the last ones of them) against the closed form in float32 and float64.

    The gradients are matrix products: their floor is the same product of magnitudes, ``|dh| |W|^T`` and
    ``|x|^T |dh|``; ``y`` and ``z`` take the tensor's largest element.
    """
    operands = (x, w, gy, gz)
    want, want64 = _expected(*operands), _expected(*(a.astype(np.float64) for a in operands))
    y = want64[0]
    dh = (np.abs(gy) + 2 * np.abs(y * gz)) * (1 - y * y)
    scales = (None, None, dh @ np.abs(w.T), np.abs(x.T) @ dh)
    names = ("y", "z", "x's gradient", "W's gradient")
    for i in range(4 - len(actual), 4):
        assert_close(
            actual[i - 4 + len(actual)],
            want[i],
            want64[i],
            rtol=1e-5,
            scale=scales[i],
            name=names[i],
        )


def test_vjp_graph_adds_the_gradient_of_an_output_that_a_node_also_reads(ort_run):
    model, w = _two_outputs()
    vjp = build_vjp_graph(model, ["W", "x"])
    assert vjp.differentiable == ("y", "z") and vjp.output_grads == ("y_grad", "z_grad")
    assert vjp.gradients == ("W", "x")
    assert [i.name for i in vjp.model.graph.input] == ["x", "W", "y_grad", "z_grad"]
    rng = np.random.default_rng(1)
    x, gy, gz = (rng.standard_normal(s).astype(np.float32) for s in ((5, 4), (5, 3), (5, 3)))
    y, z, w_grad, x_grad = ort_run(vjp.model, {"x": x, "W": w, "y_grad": gy, "z_grad": gz})
    _check([y, z, x_grad, w_grad], x, w, gy, gz)


def test_split_halves_compute_the_same_without_recomputing(ort_run):
    model, w = _two_outputs()
    vjp = build_vjp_graph(model, ["W"])
    split = split_vjp_graph(vjp)
    grad_ops = {n.op_type for n in split.forward.graph.node} & {"TanhGrad", "Gemm"}
    assert not grad_ops  # no gradient node runs in the forward
    assert not {n.op_type for n in split.backward.graph.node} & {
        "Tanh",
        "MatMul",
    }  # nothing runs twice
    rng = np.random.default_rng(2)
    x, gy, gz = (rng.standard_normal(s).astype(np.float32) for s in ((5, 4), (5, 3), (5, 3)))
    fetched = dict(
        zip(
            [o.name for o in split.forward.graph.output],
            ort_run(split.forward, {"x": x, "W": w}),
            strict=True,
        )
    )
    feeds = {**fetched, "x": x, "W": w, "y_grad": gy, "z_grad": gz}
    (w_grad,) = ort_run(split.backward, {n: feeds[n] for n in split.backward_inputs})
    _check([w_grad], x, w, gy, gz)


def test_values_without_a_differentiable_path_get_no_gradient():
    """``S`` reaches the output only through Shape: ONNX Runtime calls it unreachable; it is left out."""
    model = _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Shape", ["S"], ["s"]),
            helper.make_node("Reshape", ["h", "s"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [3, 2])],
        [
            numpy_helper.from_array(np.ones((3, 3), np.float32), "W"),
            numpy_helper.from_array(np.ones((3, 2), np.float32), "S"),
        ],
    )
    vjp = build_vjp_graph(model, ["W", "S"])
    assert vjp.gradients == ("W",)


def test_inference_batch_norm_as_elementary_ops(ort_run):
    rng = np.random.default_rng(3)
    c = 3
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "var"),
    ]
    model = _model(
        [
            helper.make_node(
                "BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3
            )
        ],
        [helper.make_tensor_value_info("x", F, [2, c, 4, 5])],
        [helper.make_tensor_value_info("y", F, [2, c, 4, 5])],
        inits,
    )
    x = rng.standard_normal((2, c, 4, 5)).astype(np.float32)
    (expected,) = ort_run(model, {"x": x})
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert batch_norm_inference_as_elementary(rewritten) == 1
    assert "BatchNormalization" not in {n.op_type for n in rewritten.graph.node}
    (actual,) = ort_run(rewritten, {"x": x})
    assert_close(
        actual, expected, rtol=1e-5, name="y"
    )  # the model before and after: two of ours, no float64 truth
