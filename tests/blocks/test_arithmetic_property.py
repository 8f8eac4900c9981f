"""Property test: random losses and Value arithmetic on a small model equal torch, or fail as a library error.

Hypothesis composes expressions over two model outputs (``Value`` arithmetic with Python and numpy
constants on either side, powers with both sides depending on the parameters) and sums of losses over
them. Each composition is built into training artifacts and run by ONNX Runtime's training API; its loss
and gradients must equal a torch recomputation in float32 (rtol 1e-4) or in float64 (within torch's own
float32-vs-float64 distance, ``support.numerics``), or building it must raise a library
exception (an ``OnnxBlocksError``, ``ValueError``, ``TypeError`` or ``LookupError`` raised by onnxblocks
itself), never an internal one. A bounded, derandomized number of examples keeps it to a few seconds.
"""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support import models
from support.numerics import assert_close

import onnxblocks as ob
from onnxblocks import losses
from onnxblocks.blocks import value
from onnxblocks.errors import OnnxBlocksError

PACKAGE = Path(ob.__file__).resolve().parent
N, D, C = 3, 4, 2  # batch, features, outputs (classes)
RNG = np.random.default_rng(7)
X = RNG.standard_normal((N, D)).astype(np.float32)
W = (RNG.standard_normal((D, C)) * 0.5).astype(np.float32)
B = (RNG.standard_normal(C) * 0.5).astype(np.float32)


def _model() -> onnx.ModelProto:
    """``y = x @ W + b`` and ``h = sigmoid(y)``: two outputs depending on both parameters."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
            helper.make_node("Sigmoid", ["y"], ["h"]),
        ],
        "property",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, D])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [N, C]) for n in ("y", "h")],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# ------------------------------------------------------------------ expressions
# A constant is (kind, number): how onnxblocks receives it; torch gets the same number in its dtype.
constants = st.tuples(
    st.sampled_from(["python", "np.float32", "np.float64", "np.array"]),
    st.sampled_from([0.5, 2.0, -1.5, 3.0, 0.1]),
)
leaves = st.sampled_from([("out", "y"), ("out", "h")])


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.tuples(st.just("neg"), children),
        st.tuples(st.just("abs"), children),
        st.tuples(
            st.sampled_from(["const*", "*const", "const+", "+const", "const-", "/const"]),
            children,
            constants,
        ),
        st.tuples(st.sampled_from(["+", "-", "*"]), children, children),
        st.tuples(st.just("div_safe"), children, children),  # a / (|b| + 1)
        st.tuples(st.just("pow_const"), children, st.sampled_from([2, 3, 0.5])),  # (|a| + 0.5) ** k
        st.tuples(st.just("pow_value"), children, children),  # (|a| + 0.5) ** (0.1 * b + 1)
    )


expressions = st.recursive(leaves, _extend, max_leaves=5)
loss_names = st.sampled_from(
    ["mse", "l1", "huber", "smooth_l1", "bce", "cross_entropy", "nll", "kl_div"]
)
loss_terms = st.tuples(
    loss_names, expressions, st.sampled_from(["mean", "sum"]), st.sampled_from([0.5, 1.0, np.inf])
)
programs = st.tuples(
    st.lists(st.tuples(loss_terms, st.sampled_from([1.0, 0.25, -0.5])), min_size=1, max_size=3),
    st.sampled_from(["plain", "square", "half", "abs"]),
)


def _constant(kind: str, number: float, torch_side: bool) -> Any:
    if torch_side:
        return torch.tensor(
            np.full(C, number) if kind == "np.array" else number, dtype=torch.float64
        )
    return {
        "python": number,
        "np.float32": np.float32(number),
        "np.float64": np.float64(number),
        "np.array": np.full(C, number),
    }[kind]


def _evaluate(expr: tuple, env: dict[str, Any], torch_side: bool) -> Any:
    op = expr[0]
    if op == "out":
        return env[expr[1]]

    def sub(e: tuple) -> Any:
        return _evaluate(e, env, torch_side)

    if op == "neg":
        return -sub(expr[1])
    if op == "abs":
        return abs(sub(expr[1]))
    if op in ("+", "-", "*"):
        a, b = sub(expr[1]), sub(expr[2])
        return a + b if op == "+" else a - b if op == "-" else a * b
    if op == "div_safe":
        return sub(expr[1]) / (abs(sub(expr[2])) + 1)
    if op == "pow_const":
        return (abs(sub(expr[1])) + 0.5) ** expr[2]
    if op == "pow_value":
        return (abs(sub(expr[1])) + 0.5) ** (0.1 * sub(expr[2]) + 1)
    a, k = sub(expr[1]), _constant(*expr[2], torch_side)
    if (
        torch_side
    ):  # in the dtype torch runs in (the float32 reference rounds the constant as onnxblocks does)
        k = k.to(env["y"].dtype)
    return {
        "const*": lambda: k * a,
        "*const": lambda: a * k,
        "const+": lambda: k + a,
        "+const": lambda: a + k,
        "const-": lambda: k - a,
        "/const": lambda: a / k,
    }[op]()


def _onnxblocks_loss(name: str, reduction: str, option: float) -> ob.Block:
    return {
        "mse": lambda: losses.MSELoss(reduction),
        "l1": lambda: losses.L1Loss(reduction),
        "huber": lambda: losses.HuberLoss(reduction, delta=option),
        "smooth_l1": lambda: losses.SmoothL1Loss(reduction, beta=option),
        "bce": lambda: losses.BCEWithLogitsLoss(reduction=reduction),
        "cross_entropy": lambda: losses.CrossEntropyLoss(reduction=reduction),
        "nll": lambda: losses.NLLLoss(reduction=reduction),
        "kl_div": lambda: losses.KLDivLoss(reduction=reduction),
    }[name]()


def _torch_loss(name: str, reduction: str, option: float) -> torch.nn.Module:
    return {
        "mse": lambda: torch.nn.MSELoss(reduction=reduction),
        "l1": lambda: torch.nn.L1Loss(reduction=reduction),
        "huber": lambda: torch.nn.HuberLoss(reduction=reduction, delta=option),
        "smooth_l1": lambda: torch.nn.SmoothL1Loss(reduction=reduction, beta=option),
        "bce": lambda: torch.nn.BCEWithLogitsLoss(reduction=reduction),
        "cross_entropy": lambda: torch.nn.CrossEntropyLoss(reduction=reduction),
        "nll": lambda: torch.nn.NLLLoss(reduction=reduction),
        "kl_div": lambda: torch.nn.KLDivLoss(reduction=reduction),
    }[name]()


def _target(name: str, index: int) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(100 + index)
    if name in ("cross_entropy", "nll"):
        return f"labels{index}", rng.integers(0, C, N).astype(np.int64)
    if name in ("bce", "kl_div"):
        return f"target{index}", rng.uniform(0.05, 0.95, (N, C)).astype(np.float32)
    return f"target{index}", rng.standard_normal((N, C)).astype(np.float32)


def _finish(total: Any, final: str) -> Any:
    return {"plain": total, "square": total**2, "half": total / 2, "abs": abs(total)}[final]


class _Program(ob.Block):
    def __init__(self, program: tuple) -> None:
        super().__init__()
        self.program = program

    def build(self, y: str, h: str) -> Any:
        terms, final = self.program
        env = {"y": value(y), "h": value(h)}
        total = None
        for index, ((name, expr, reduction, option), weight) in enumerate(terms):
            target, _ = _target(name, index)
            term = weight * _onnxblocks_loss(name, reduction, option)(
                _evaluate(expr, env, False), target
            )
            total = term if total is None else total + term
        return _finish(total, final)


def _torch_reference(
    program: tuple, dtype=torch.float64
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    terms, final = program
    w = torch.tensor(W, dtype=dtype, requires_grad=True)
    b = torch.tensor(B, dtype=dtype, requires_grad=True)
    xw = torch.tensor(X, dtype=dtype) @ w
    env = {"y": xw + b, "h": torch.sigmoid(xw + b)}
    total = None
    for index, ((name, expr, reduction, option), weight) in enumerate(terms):
        _, target = _target(name, index)
        target_t = (
            torch.tensor(target) if target.dtype == np.int64 else torch.tensor(target, dtype=dtype)
        )
        term = weight * _torch_loss(name, reduction, option)(_evaluate(expr, env, True), target_t)
        total = term if total is None else total + term
    loss = _finish(total, final)
    loss.backward()
    return loss.detach().numpy(), {"W": w.grad.numpy(), "b": b.grad.numpy()}


def _is_library_error(exc: BaseException) -> bool:
    """Raised on purpose by onnxblocks: a library exception type, from a frame of onnxblocks' own code."""
    frames = traceback.extract_tb(exc.__traceback__)
    from_library = bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(PACKAGE)
    return from_library and isinstance(exc, (OnnxBlocksError, ValueError, TypeError, LookupError))


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(program=programs)
def test_random_losses_and_arithmetic_match_torch_or_fail_clearly(tmp_path_factory, program):
    directory = tmp_path_factory.mktemp("program")
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # KLDivLoss(reduction="mean") warns, in torch and in onnxblocks
        try:
            art = ob.generate_artifacts(
                _model(),
                requires_grad=["W", "b"],
                loss=_Program(program),
                artifact_directory=directory,
            )
        except Exception as exc:
            assert _is_library_error(exc), f"internal error for {program}:\n" + "".join(
                traceback.format_exception(exc)
            )
            return
        expected_loss, expected_grads = _torch_reference(program, torch.float32)
        loss64, grads64 = _torch_reference(program)
    feeds = {"x": X} | {
        name: array for name, array in (_target(t[0][0], i) for i, t in enumerate(program[0]))
    }
    trainer = models.OrtTrainer(art, optimizer=False)
    (loss, *_) = trainer.train_step(*[feeds[n] for n in art.input_names])
    assert_close(loss, expected_loss, loss64, rtol=1e-4, name=f"loss of {program}")
    for name, want in expected_grads.items():
        assert_close(
            trainer.grad(name), want, grads64[name], rtol=1e-4, name=f"d/d{name} of {program}"
        )


def test_library_error_predicate_tells_internal_errors_apart():
    with pytest.raises(ValueError) as library:
        losses.HuberLoss(delta=-1.0)
    assert _is_library_error(library.value)
    with pytest.raises(ValueError) as internal:
        np.zeros(2).reshape(3)
    assert not _is_library_error(internal.value)
