"""The loss gradients' lowerings in other element types than float32: int32 labels, float64, float16.

The oracles are the training build's float32 kernel (``SoftmaxCrossEntropyLossGrad``,
``GatherElementsGrad``) on the same numbers and the gradient in float64 NumPy
(``support.numerics``): the lowered graph, in the case's dtype, must give its result
within that dtype's precision (a float64 lowering within float64's: 1e-12 relative),
and use no ``OneHot`` and no float16 scatter-add (ONNX Runtime has no CPU kernel for either).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper
from support.numerics import assert_close

from onnxblocks._core.ort import onnxruntime
from onnxblocks.portable import non_portable_ops
from onnxblocks.portable.lower import lower_training_ops

MS = "com.microsoft"
RNG = np.random.default_rng(19)
#: relative bounds; a float64 lowering is held to float64 NumPy, the others to the float32 kernel
RTOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-2}


def _model(op: str, inputs: dict[str, np.ndarray], attrs: dict[str, Any]) -> onnx.ModelProto:
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for n, v in inputs.items()
    ]
    out_type = helper.np_dtype_to_tensor_dtype(
        next(v.dtype for v in inputs.values() if v.dtype.kind == "f")
    )
    node = helper.make_node(op, list(inputs), ["dX"], name=f"{op}_node", domain=MS, **attrs)
    graph = helper.make_graph(
        [node], "case", graph_inputs, [helper.make_tensor_value_info("dX", out_type, None)]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


def _check(
    op: str, inputs: dict[str, np.ndarray], attrs: dict[str, Any], dtype: type, reference
) -> None:
    """The lowering in ``dtype`` against the float32 kernel and ``reference`` (the float64 gradient and the
    magnitude of its operands); no OneHot, no float16 scatter-add left."""
    as_float32 = {
        n: v.astype(np.float32) if v.dtype.kind == "f" else v.astype(np.int64)
        for n, v in inputs.items()
    }
    expected = _run(_model(op, as_float32, attrs), as_float32)
    typed = {n: v.astype(dtype) if v.dtype.kind == "f" else v for n, v in inputs.items()}
    lowered = _model(op, typed, attrs)
    lower_training_ops(lowered)
    assert non_portable_ops(lowered) == []
    assert "OneHot" not in {n.op_type for n in lowered.graph.node}
    got = _run(lowered, typed)  # a float16 scatter-add would fail here (no CPU kernel adds float16)
    assert got.dtype == dtype
    typed64 = {
        n: v.astype(dtype).astype(np.float64) if v.dtype.kind == "f" else v
        for n, v in inputs.items()
    }
    expected64, scale = reference(
        typed64
    )  # on the numbers the lowering got (a float16 input is rounded)
    if dtype is np.float64:
        assert_close(got, expected64, rtol=RTOL[dtype], scale=scale, name=op)
    else:
        assert_close(got, expected, expected64, rtol=RTOL[dtype], scale=scale, name=op)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=lambda d: d.__name__)
@pytest.mark.parametrize("label_dtype", [np.int64, np.int32], ids=lambda d: d.__name__)
@pytest.mark.parametrize(
    ("reduction", "ignore", "weighted"),
    [("mean", None, False), ("sum", 1, True), ("mean", 2, True)],
)
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2)], ids=str)
def test_softmax_cross_entropy_loss_grad_in_other_types(
    dtype, label_dtype, reduction, ignore, weighted, shape
):
    n, c, rest = shape[0], shape[1], shape[2:]
    labels = RNG.integers(0, c, (n, *rest)).astype(label_dtype)
    if ignore is not None:
        labels.flat[0] = ignore
    log_prob = _log_softmax(RNG.uniform(-2, 2, shape))
    inputs = {"dY": np.array(1.3), "log_prob": log_prob, "label": labels}
    if weighted:
        inputs["weight"] = RNG.uniform(0.1, 2.0, c)
    attrs: dict[str, Any] = {"reduction": reduction} | (
        {"ignore_index": ignore} if ignore is not None else {}
    )
    _check(
        "SoftmaxCrossEntropyLossGrad",
        inputs,
        attrs,
        dtype,
        lambda v: _cross_entropy_grad(v, reduction, ignore),
    )


def _cross_entropy_grad(inputs: dict[str, np.ndarray], reduction: str, ignore: int | None):
    """dX = dY * (softmax - one_hot) * w[label] / (sum of the kept labels' weights for "mean"), and the
    magnitude of each element's operands."""
    log_prob, label = inputs["log_prob"], inputs["label"].astype(np.int64)
    classes = log_prob.shape[1]
    kept = label != (ignore if ignore is not None else -(2**62))
    safe = np.where(kept, label, 0)
    weight = inputs["weight"][safe] if "weight" in inputs else np.ones(label.shape)
    coefficient = np.where(kept, weight, 0.0) * inputs["dY"]
    total = np.where(kept, weight, 0.0).sum()
    if reduction == "mean":  # every label ignored: a zero gradient, as the kernel gives
        coefficient = coefficient / total if total else coefficient * 0.0
    one_hot = (
        np.arange(classes).reshape(1, classes, *[1] * (label.ndim - 1)) == safe[:, None]
    ).astype(float)
    p = np.exp(log_prob)
    return (p - one_hot) * coefficient[:, None], (p + one_hot) * np.abs(coefficient[:, None])


@pytest.mark.parametrize("dtype", [np.float64, np.float16], ids=lambda d: d.__name__)
@pytest.mark.parametrize(
    ("data", "indices", "axis"), [((3, 4), (3, 2), 1), ((3, 4), (5, 4), 0)], ids=str
)
def test_gather_elements_grad_adds_repeated_indices_in_other_types(dtype, data, indices, axis):
    index = RNG.integers(0, data[axis], indices).astype(np.int64)  # repeats: the scatter must add
    inputs = {
        "dY": RNG.uniform(-2, 2, indices),
        "shape": np.array(data, np.int64),
        "indices": index,
    }

    def scatter_add(values: dict[str, np.ndarray]):
        """The float64 scatter-add of dY, and that of |dY| (the floor's scale)."""
        out = [np.zeros(data), np.zeros(data)]
        for position in np.ndindex(*indices):
            target = list(position)
            target[axis] = index[position]
            out[0][tuple(target)] += values["dY"][position]
            out[1][tuple(target)] += abs(values["dY"][position])
        return out

    _check("GatherElementsGrad", inputs, {"axis": axis}, dtype, scatter_add)
