"""Inference-mode Dropout is the identity with gradient ``dY``; float64 Concat and BatchNorm epsilon.

ONNX Runtime 1.19.2's ``DropoutGrad`` ignores ``training_mode`` and scales ``dY`` by ``1 / (1 - ratio)``
(ratio 0.5 when none is given): an inference-mode Dropout would get twice its gradient. Every spelling of
inference mode (no flag, a constant false flag, a ratio attribute before opset 12, a ratio input only)
must give ``dY`` exactly, through ``build_vjp_graph`` and through ``generate_artifacts`` (compared with
the same model without the Dropout). A run-time flag gates the ratio, so both modes stay right.

The gradient of a float64 ``Concat`` (``SplitTraining``) has a registered double kernel that fails when
it runs: it is refused when the graph is built, naming the op and node. An absent BatchNormalization
``epsilon`` is the float32 ``1e-5`` the op stores, also in float64.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from pass_oracle import make_model, vi
from support.numerics import assert_close, assert_equal

import onnxblocks
from onnxblocks._core.ort import onnxruntime
from onnxblocks.artifacts import LossType, OptimType
from onnxblocks.errors import GradientError
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.runtime import TrainingSession

F32, F64 = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
SHAPE = (3, 4)


def _ratio(value: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), "r")


def _flag(value: bool, constant_node: bool = False):
    if constant_node:
        return helper.make_node(
            "Constant", [], ["t"], value=numpy_helper.from_array(np.array(value), "t")
        )
    return numpy_helper.from_array(np.array(value), "t")


#: name -> (nodes, initializers, opset): each an inference-mode Dropout writing ``y`` from ``x``
INFERENCE = {
    "no-inputs-13": ([helper.make_node("Dropout", ["x"], ["y"])], [], 13),
    "ratio-attribute-10": ([helper.make_node("Dropout", ["x"], ["y"], ratio=0.3)], [], 10),
    "ratio-input-only-13": ([helper.make_node("Dropout", ["x", "r"], ["y"])], [_ratio()], 13),
    "ratio-input-only-12": ([helper.make_node("Dropout", ["x", "r"], ["y"])], [_ratio()], 12),
    "training-mode-false-initializer": (
        [helper.make_node("Dropout", ["x", "r", "t"], ["y"])],
        [_ratio(), _flag(False)],
        17,
    ),
    "training-mode-false-constant": (
        [_flag(False, True), helper.make_node("Dropout", ["x", "", "t"], ["y"])],
        [],
        17,
    ),
    "mask-read": (
        [
            helper.make_node("Dropout", ["x", "r"], ["d", "m"]),
            helper.make_node("Where", ["m", "d", "x"], ["y"]),
        ],
        [_ratio()],
        13,
    ),
}


def _vjp_run(
    model: onnx.ModelProto, feeds: dict, grad_out: np.ndarray, wanted: list[str]
) -> dict[str, np.ndarray]:
    vjp = build_vjp_graph(model, requires_grad=wanted, outputs=["y"])
    session = onnxruntime().InferenceSession(
        vjp.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(
        zip(names, session.run(None, {**feeds, vjp.output_grads[0]: grad_out}), strict=True)
    )


@pytest.mark.parametrize("elem", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", list(INFERENCE))
def test_inference_dropout_is_the_identity_with_gradient_dy(name: str, elem: int) -> None:
    nodes, inits, opset = INFERENCE[name]
    model = make_model(nodes, [vi("x", list(SHAPE), elem)], [vi("y", None, elem)], inits, opset)
    dtype = np.float32 if elem == F32 else np.float64
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(dtype)
    dy = np.random.default_rng(2).standard_normal(SHAPE).astype(dtype)
    got = _vjp_run(model, {"x": x}, dy, ["x"])
    assert_equal(got["y"], x, name=f"{name} output")
    assert_equal(got["x_grad"], dy, name=f"{name} gradient")


@pytest.mark.parametrize("training", [False, True])
def test_a_run_time_training_flag_gives_each_mode_its_gradient(training: bool) -> None:
    model = make_model(
        [helper.make_node("Dropout", ["x", "r", "t"], ["y", "m"])],
        [vi("x", list(SHAPE), F64), vi("t", [], onnx.TensorProto.BOOL)],
        [vi("y", None, F64), vi("m", None, onnx.TensorProto.BOOL)],
        [_ratio(0.25)],
        17,
    )
    x = np.random.default_rng(1).standard_normal(SHAPE)
    dy = np.random.default_rng(2).standard_normal(SHAPE)
    vjp = build_vjp_graph(model, requires_grad=["x"], outputs=["y", "m"], no_grad_outputs=["m"])
    session = onnxruntime().InferenceSession(
        vjp.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    y, mask, grad = session.run(
        ["y", "m", "x_grad"], {"x": x, "t": np.array(training), vjp.output_grads[0]: dy}
    )
    scale = 1 / (1 - np.float64(np.float32(0.25))) if training else 1.0
    # the kernel scales by its float32 ratio: one rounding of the product in float64
    assert_close(y, np.where(mask, x * scale, 0.0), rtol=1e-15, name="output")
    assert_close(grad, np.where(mask, dy * scale, 0.0), rtol=1e-15, name="gradient")
    if not training:
        assert mask.all()


def _linear(dropout: bool, elem: int) -> onnx.ModelProto:
    dtype = np.float32 if elem == F32 else np.float64
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 5)).astype(dtype), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h" if dropout else "y"])]
    if dropout:
        nodes.append(helper.make_node("Dropout", ["h", "r", "t"], ["y"]))
    inits = [w, _ratio(0.4), _flag(False)] if dropout else [w]
    return make_model(nodes, [vi("x", [2, 4], elem)], [vi("y", [2, 5], elem)], inits, 17)


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
def test_generated_artifacts_train_through_inference_dropout_as_without_it(
    tmp_path, portable: bool
) -> None:
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    target = np.random.default_rng(5).standard_normal((2, 5)).astype(np.float32)
    results = {}
    for dropout in (False, True):
        directory = tmp_path / f"dropout-{dropout}"
        onnxblocks.generate_artifacts(
            _linear(dropout, F32),
            ["W"],
            loss=LossType.MSELoss,
            optimizer=OptimType.AdamW,
            artifact_directory=directory,
            portable=portable,
        )
        session = TrainingSession(directory)
        loss = session.train_step(x, target)[0]
        results[dropout] = (loss, session.gradients()["W"], session.eval_step(x, target)[0])
    for part, without, with_ in zip(
        ("loss", "gradient", "eval loss"), results[False], results[True], strict=True
    ):
        assert_equal(with_, without, name=part)


def test_float64_concat_gradient_is_refused_by_name() -> None:
    model = make_model(
        [helper.make_node("Concat", ["a", "b"], ["y"], axis=0, name="join")],
        [vi("a", list(SHAPE), F64), vi("b", list(SHAPE), F64)],
        [vi("y", None, F64)],
    )
    with pytest.raises(
        GradientError, match=r"double for SplitTraining, which node 'join/.*gradient of Concat"
    ):
        build_vjp_graph(model, requires_grad=["a", "b"], outputs=["y"])


def test_float32_concat_gradient_still_builds() -> None:
    model = make_model(
        [helper.make_node("Concat", ["a", "b"], ["y"], axis=0)],
        [vi("a", list(SHAPE), F32), vi("b", list(SHAPE), F32)],
        [vi("y", None, F32)],
    )
    a, b = (np.random.default_rng(i).standard_normal(SHAPE).astype(np.float32) for i in (1, 2))
    dy = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32)
    got = _vjp_run(model, {"a": a, "b": b}, dy, ["a", "b"])
    assert_equal(got["a_grad"], dy[:3], name="gradient of a")
    assert_equal(got["b_grad"], dy[3:], name="gradient of b")


def test_float64_batch_norm_without_epsilon_uses_the_float32_default() -> None:
    """Zero variances make ``1/sqrt(epsilon)`` the whole factor: 1e-5 instead of float32 1e-5 is 1e-8 off."""
    stats = {"b": np.array([0.5, -1.0, 2.0]), "m": np.array([0.1, 0.2, -0.3]), "v": np.zeros(3)}
    model = make_model(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
        [vi("x", [2, 3, 4], F64), vi("s", [3], F64)],
        [vi("y", None, F64)],
        [numpy_helper.from_array(value, name) for name, value in stats.items()],
    )
    rng = np.random.default_rng(6)
    x, s, dy = (
        rng.standard_normal((2, 3, 4)),
        rng.standard_normal(3),
        rng.standard_normal((2, 3, 4)),
    )
    got = _vjp_run(model, {"x": x, "s": s}, dy, ["x", "s"])
    xt, st = (torch.tensor(a, requires_grad=True) for a in (x, s))
    eps = float(np.float32(1e-5))
    expected = torch.nn.functional.batch_norm(
        xt,
        torch.from_numpy(stats["m"]),
        torch.from_numpy(stats["v"]),
        st,
        torch.from_numpy(stats["b"]),
        eps=eps,
    )
    (expected * torch.from_numpy(dy)).sum().backward()
    assert_close(got["y"], expected.detach(), rtol=1e-12, name="output")
    assert_close(got["x_grad"], xt.grad, rtol=1e-12, name="gradient of x")
    assert_close(got["s_grad"], st.grad, rtol=1e-12, name="gradient of s")
