"""Float64 gradients stay float64: each op's gradient against torch's float64 one, on both backends.

ONNX Runtime 1.19.2 computes two float64 gradients with float32 numbers: ``ReduceMean``'s (a float32
``1/N`` through ``Scale``) and ``LayerNormalization``'s (float32 statistics and sums), and the group and
instance norms inherit the first; :mod:`onnxblocks.gradient.float64` rewrites them before the builder.
Each case is a small float64 graph differentiated by ``build_vjp_graph`` and run twice: on the training
build (ONNX Runtime's gradient kernels) and lowered to standard ops (the portable backend's graph, run on
the same build). Output and gradients must be within :data:`FLOAT64_RTOL` of torch's float64 run, plus
the float64 floor: one float32 rounding anywhere is ~1e-8 relative, four orders above the bound. Reduced
sizes are no powers of two, so that ``1/N`` is inexact in float32.

Ops whose float64 gradient ONNX Runtime 1.19.2 cannot run at all (no double kernel, or no gradient
builder) are refused when the graph is built, naming the op: never computed in float32 in silence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from pass_oracle import check_pass, make_model, vi
from support.numerics import assert_close

from onnxblocks._core.ort import onnxruntime
from onnxblocks.errors import GradientError
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.gradient.float64 import (
    Float64LayerNormAsElementary,
    Float64ReduceMeanAsSumDiv,
    may_hold_float64,
)
from onnxblocks.ir.serde import from_proto
from onnxblocks.portable import non_portable_ops
from onnxblocks.portable.lower import lower_training_ops

#: float64 results against torch's float64 ones (plus the float64 floor of support.numerics)
FLOAT64_RTOL = 1e-12
D = onnx.TensorProto.DOUBLE
F = torch.nn.functional
SHAPE = (3, 5, 6)
MS = ("com.microsoft", 1)


def f32(value: float) -> float:
    """A float attribute as ONNX stores it (float32), which the op and torch must both use."""
    return float(np.float32(value))


def ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def doubles(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.float64), name)


@dataclass
class Case:
    """A float64 graph writing ``y`` from float64 inputs (all differentiated) and torch's ``fn`` of them."""

    nodes: list
    inputs: dict  # name -> shape (symbolic dims as strings)
    fn: Callable
    opset: int = 17
    inits: list = field(default_factory=list)
    positive: tuple = ()  # inputs drawn from [0.5, 2)
    feeds: dict = field(default_factory=dict)  # inputs without a gradient (e.g. run-time axes)
    extra_opsets: tuple = ()

    def model(self) -> onnx.ModelProto:
        graph_inputs = [vi(k, s, D) for k, s in self.inputs.items()]
        graph_inputs += [
            vi(k, list(v.shape), onnx.TensorProto.INT64) for k, v in self.feeds.items()
        ]
        return make_model(
            self.nodes, graph_inputs, [vi("y", None, D)], self.inits, self.opset, self.extra_opsets
        )

    def arrays(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in self.inputs.items():
            dims = [SHAPE[i] if isinstance(d, str) else d for i, d in enumerate(shape)]
            out[name] = (
                rng.uniform(0.5, 2.0, dims) if name in self.positive else rng.standard_normal(dims)
            )
        return out


def node(op: str, inputs: list, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, ["y"], **attrs)


def node_in(domain: str, op: str, inputs: list, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, ["y"], domain=domain, **attrs)


X = {"x": list(SHAPE)}
LN_EPS = f32(1e-5)

CASES = {
    # ReduceMean: every form (the leak: a float32 1/N)
    "ReduceMean-13-axis-1": Case(
        [node("ReduceMean", ["x"], axes=[1], keepdims=0)], X, lambda x: x.mean(1), 13
    ),
    "ReduceMean-13-all-keepdims": Case(
        [node("ReduceMean", ["x"])], X, lambda x: x.mean((0, 1, 2), keepdim=True), 13
    ),
    "ReduceMean-12-negative-axes": Case(
        [node("ReduceMean", ["x"], axes=[-1, 0], keepdims=1)],
        X,
        lambda x: x.mean((0, 2), keepdim=True),
        12,
    ),
    "ReduceMean-18-axes-input": Case(
        [node("ReduceMean", ["x", "axes"], keepdims=0)],
        X,
        lambda x: x.mean((0, 2)),
        18,
        [ints("axes", [0, 2])],
    ),
    "ReduceMean-18-no-axes": Case(
        [node("ReduceMean", ["x"], keepdims=0)], X, lambda x: x.mean(), 18
    ),
    "ReduceMean-18-noop-empty-axes": Case(
        [node("ReduceMean", ["x", "axes"], noop_with_empty_axes=1)],
        X,
        lambda x: x * 1,
        18,
        [ints("axes", [])],
    ),
    "ReduceMean-18-symbolic-dims": Case(
        [node("ReduceMean", ["x", "axes"])],
        {"x": ["batch", 5, "n"]},
        lambda x: x.mean((0, 2), keepdim=True),
        18,
        [ints("axes", [0, -1])],
    ),
    "ReduceMean-18-run-time-axes": Case(
        [node("ReduceMean", ["x", "axes"], keepdims=0)],
        X,
        lambda x: x.mean(1),
        18,
        feeds={"axes": np.array([1])},
    ),
    "ReduceMean-of-tanh": Case(
        [helper.make_node("Tanh", ["x"], ["t"]), node("ReduceMean", ["t"], axes=[2], keepdims=1)],
        X,
        lambda x: torch.tanh(x).mean(2, keepdim=True),
        13,
    ),
    # norms (the leaks: float32 statistics, and ReduceMean inside the instance / group norm rewrite)
    "LayerNormalization-last-axis": Case(
        [node("LayerNormalization", ["x", "g", "b"], axis=-1)],
        {**X, "g": [6], "b": [6]},
        lambda x, g, b: F.layer_norm(x, (6,), g, b, LN_EPS),
    ),
    "LayerNormalization-axis-1-no-bias": Case(
        [node("LayerNormalization", ["x", "g"], axis=1, epsilon=1e-3)],
        {**X, "g": [5, 6]},
        lambda x, g: F.layer_norm(x, (5, 6), g, None, f32(1e-3)),
    ),
    "LayerNormalization-com.microsoft": Case(
        [node_in("com.microsoft", "LayerNormalization", ["x", "g", "b"], axis=-1)],
        {**X, "g": [6], "b": [6]},
        lambda x, g, b: F.layer_norm(x, (6,), g, b, LN_EPS),
        extra_opsets=(MS,),
    ),
    "InstanceNormalization": Case(
        [node("InstanceNormalization", ["x", "s", "b"])],
        {**X, "s": [5], "b": [5]},
        lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=LN_EPS),
    ),
    "GroupNormalization-18": Case(
        [node("GroupNormalization", ["x", "s", "b"], num_groups=1)],
        {"x": [2, 3, 5], "s": [1], "b": [1]},
        lambda x, s, b: F.group_norm(x, 1, eps=LN_EPS) * s + b,
        18,
    ),
    # elementwise and contractions (no leak: the family that must stay so)
    "Div": Case(
        [node("Div", ["a", "b"])], {"a": list(SHAPE), "b": [6]}, lambda a, b: a / b, positive=("b",)
    ),
    "Sqrt": Case([node("Sqrt", ["x"])], X, torch.sqrt, positive=("x",)),
    "Pow-constant-exponent": Case(
        [node("Pow", ["x", "e"])], X, lambda x: x**0.7, 17, [doubles("e", 0.7)], ("x",)
    ),
    "Tanh": Case([node("Tanh", ["x"])], X, torch.tanh),
    "Sigmoid": Case([node("Sigmoid", ["x"])], X, torch.sigmoid),
    "Exp-Log": Case(
        [helper.make_node("Exp", ["x"], ["e"]), node("Log", ["e"])],
        X,
        lambda x: torch.log(torch.exp(x)),
    ),
    "MatMul-2d": Case([node("MatMul", ["a", "b"])], {"a": [5, 6], "b": [6, 3]}, lambda a, b: a @ b),
    "Gemm-transB-alpha-beta": Case(
        [node("Gemm", ["a", "b", "c"], transB=1, alpha=0.1, beta=2.0)],
        {"a": [5, 6], "b": [3, 6], "c": [3]},
        lambda a, b, c: f32(0.1) * (a @ b.T) + 2.0 * c,
    ),
}


def _run(
    model: onnx.ModelProto, feeds: dict, grad_out: np.ndarray, portable: bool
) -> dict[str, np.ndarray]:
    """``y`` and the gradients of the float inputs, from the training build or the portable lowering."""
    floats = [name for name, v in feeds.items() if v.dtype == np.float64]
    vjp = build_vjp_graph(model, requires_grad=floats, outputs=["y"])
    graph = vjp.model
    if portable:
        lower_training_ops(graph)
        assert not non_portable_ops(graph), [op for _, op, _ in non_portable_ops(graph)]
    assert not [n for n in graph.graph.node if n.op_type == "Scale"], (
        "a Scale rounds its factor to float32"
    )
    session = onnxruntime().InferenceSession(
        graph.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(
        zip(names, session.run(None, {**feeds, vjp.output_grads[0]: grad_out}), strict=True)
    )


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
@pytest.mark.parametrize("name", list(CASES))
def test_float64_gradient_is_torchs_float64_gradient(name: str, portable: bool) -> None:
    case = CASES[name]
    arrays = case.arrays(seed=len(name))
    xs = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in arrays.items()}
    expected = case.fn(**xs)
    grad_out = np.random.default_rng(7).standard_normal(tuple(expected.shape))
    (expected * torch.from_numpy(grad_out)).sum().backward()
    got = _run(case.model(), {**arrays, **case.feeds}, grad_out, portable)
    assert got["y"].dtype == np.float64
    assert_close(got["y"], expected.detach(), rtol=FLOAT64_RTOL, name=f"{name} output")
    for k, x in xs.items():
        assert got[f"{k}_grad"].dtype == np.float64
        assert_close(got[f"{k}_grad"], x.grad, rtol=FLOAT64_RTOL, name=f"{name} gradient of {k}")


REFUSED = {  # op -> (graph, what the refusal names)
    "Mean": (Case([node("Mean", ["a", "b"])], {"a": list(SHAPE), "b": list(SHAPE)}, None), "Mean"),
    "Softmax": (Case([node("Softmax", ["x"], axis=-1)], X, None), "SoftmaxGrad_13"),
    "LogSoftmax": (Case([node("LogSoftmax", ["x"], axis=-1)], X, None), "LogSoftmaxGrad_13"),
    "MatMul-3d": (
        Case([node("MatMul", ["a", "b"])], {"a": list(SHAPE), "b": [6, 3]}, None),
        "FusedMatMul",
    ),
    "Relu": (Case([node("Relu", ["x"])], X, None), "ReluGrad"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_float64_gradient_without_a_float64_kernel_is_refused_by_name(name: str) -> None:
    case, named = REFUSED[name]
    with pytest.raises(GradientError, match=named):
        build_vjp_graph(case.model(), requires_grad=list(case.inputs), outputs=["y"])


# ------------------------------------------------------------------ the passes on their own
def _reduce_mean(elem: int, opset: int = 18, **attrs) -> onnx.ModelProto:
    axes = [ints("axes", [1])] if opset >= 18 else []
    inputs = ["x", "axes"] if opset >= 18 else ["x"]
    return make_model(
        [helper.make_node("ReduceMean", inputs, ["y"], **attrs)],
        [vi("x", list(SHAPE), elem)],
        [vi("y", None, elem)],
        axes,
        opset,
    )


def test_float64_reduce_mean_becomes_sum_over_count_with_the_same_values() -> None:
    x = np.random.default_rng(1).standard_normal(SHAPE)
    after = check_pass(
        Float64ReduceMeanAsSumDiv(),
        _reduce_mean(D, keepdims=0),
        {"x": x},
        {"ReduceMean": 1},
        gone="ReduceMean",
        rtol=FLOAT64_RTOL,
    )
    assert {n.op_type for n in after.graph.node} >= {"ReduceSum", "Div"}


@pytest.mark.parametrize(
    "elem", [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16], ids=["float32", "float16"]
)
def test_other_float_reduce_means_and_layer_norms_are_left_alone(elem: int) -> None:
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(dtype)
    check_pass(Float64ReduceMeanAsSumDiv(), _reduce_mean(elem), {"x": x}, {})
    scale = numpy_helper.from_array(np.ones(6, dtype=dtype), "g")
    norm = helper.make_node("LayerNormalization", ["x", "g"], ["y"])
    model = make_model([norm], [vi("x", list(SHAPE), elem)], [vi("y", None, elem)], [scale])
    check_pass(Float64LayerNormAsElementary(), model, {"x": x}, {})


def test_float64_layer_norm_statistics_that_are_read_keep_their_stash_type() -> None:
    """The Mean and InvStdDev outputs are float32 (``stash_type``'s default) when the graph reads them."""
    rng = np.random.default_rng(3)
    norm = helper.make_node(
        "LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv_std_dev"], axis=-1
    )
    outputs = [
        vi("y", None, D),
        vi("mean", None, onnx.TensorProto.FLOAT),
        vi("inv", None, onnx.TensorProto.FLOAT),
    ]
    model = make_model(
        [norm, helper.make_node("Identity", ["inv_std_dev"], ["inv"])],
        [vi("x", list(SHAPE), D)],
        outputs,
        [doubles("g", rng.standard_normal(6)), doubles("b", rng.standard_normal(6))],
    )
    after = check_pass(
        Float64LayerNormAsElementary(),
        model,
        {"x": rng.standard_normal(SHAPE)},
        {"LayerNormalization": 1},
        gone="LayerNormalization",
        rtol=float(np.finfo(np.float32).eps),
    )
    casts = {n.output[0]: n for n in after.graph.node if n.op_type == "Cast"}
    assert casts["mean"].attribute[0].i == onnx.TensorProto.FLOAT
    assert casts["inv_std_dev"].attribute[0].i == onnx.TensorProto.FLOAT


def test_a_mean_after_a_cast_to_float64_is_rewritten_and_float32_models_are_not_inferred() -> None:
    """A float32 model computing in double (its loss, say) is found by its Cast; one without any is skipped."""
    nodes = [
        helper.make_node("Cast", ["x"], ["x64"], to=D),
        helper.make_node("ReduceMean", ["x64"], ["y"], axes=[1]),
    ]
    model = make_model(nodes, [vi("x", list(SHAPE))], [vi("y", None, D)], opset=13)
    assert may_hold_float64(from_proto(model))
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    check_pass(
        Float64ReduceMeanAsSumDiv(),
        model,
        {"x": x},
        {"ReduceMean": 1},
        gone="ReduceMean",
        rtol=FLOAT64_RTOL,
    )
    assert not may_hold_float64(from_proto(_reduce_mean(onnx.TensorProto.FLOAT)))
