"""Each lowering of onnxblocks.portable on its own: standard ops equal the training build's kernel.

For every case a one-node model (plus the forward node some gradients read) runs
the training-only op on onnxruntime-training's CPU kernels; the same model after
``lower_training_ops`` holds only portable ops and runs on the same onnxruntime (the
training build runs standard ops too). The outputs must match: random inputs,
broadcasting, size-1 dims, empty batches, ranks 1 to 4, static and symbolic dims. Both sides are
float32 kernels (no float64 truth): each output within ``rtol``, the floor from the output's size
(``support.numerics``); where torch or NumPy is the oracle, it runs in float64 too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from support.numerics import assert_close, assert_equal

from onnxblocks._core.ort import onnxruntime
from onnxblocks.errors import InvalidValueError, PortabilityError
from onnxblocks.portable import LOWERINGS, non_portable_ops
from onnxblocks.portable.lower import lower_training_ops

MS = "com.microsoft"
RNG = np.random.default_rng(0)


def f32(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@dataclass
class Case:
    op: str
    inputs: dict[str, np.ndarray | None]  # None: an absent optional input
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = MS
    before: list[onnx.NodeProto] = field(default_factory=list)  # forward nodes the op reads
    node_inputs: list[str] | None = None  # the op's inputs, when not those of ``inputs`` in order
    compare: list[str] | None = None  # outputs to compare (default: all named ones)
    rtol: float = 1e-5
    opset: int = 17


def _model(case: Case, symbolic: bool) -> onnx.ModelProto:
    graph_inputs = []
    for name, value in case.inputs.items():
        if value is None:
            continue
        dims = [f"{name}_{i}" for i in range(value.ndim)] if symbolic else list(value.shape)
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        graph_inputs.append(helper.make_tensor_value_info(name, elem, dims))
    node = helper.make_node(
        case.op,
        case.node_inputs
        if case.node_inputs is not None
        else [n if v is not None else "" for n, v in case.inputs.items()],
        case.outputs,
        name=f"{case.op}_node",
        domain=case.domain,
        **case.attrs,
    )
    # typed outputs: the training build crashes on a graph output of an untyped training op (MaxPoolGrad)
    int64 = {"a_axes", "b_axes", "lengths"}
    # (MaxPoolGrad needs the shape too: '<input>_grad' gets its input's type)
    known = {i.name: i for i in graph_inputs}
    outputs = [
        helper.make_value_info(n, known[n[: -len("_grad")]].type)
        if n.endswith("_grad") and n[: -len("_grad")] in known
        else helper.make_tensor_value_info(
            n, onnx.TensorProto.INT64 if n in int64 else onnx.TensorProto.FLOAT, None
        )
        for n in (case.compare or [o for o in case.outputs if o])
    ]
    graph = helper.make_graph([*case.before, node], "case", graph_inputs, outputs)
    opsets = [helper.make_opsetid("", case.opset), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = onnxruntime()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check(case: Case, symbolic: bool = False) -> dict[str, int]:
    model = _model(case, symbolic)
    feeds = {n: v for n, v in case.inputs.items() if v is not None}
    expected = _run(
        _model(case, False), feeds
    )  # the training build's MaxPoolGrad crashes on symbolic dims
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    counts = lower_training_ops(lowered)
    assert non_portable_ops(lowered) == []
    got = _run(lowered, feeds)
    names = case.compare or [o for o in case.outputs if o]
    for name, e, g in zip(names, expected, got, strict=True):
        assert g.shape == e.shape, f"{name}: shape {g.shape} != {e.shape}"
        assert g.dtype == e.dtype, name
        assert_close(g, e, rtol=case.rtol, name=name)
    return counts


# ------------------------------------------------------------------ elementwise
ELEMENTWISE_SHAPES = [(5,), (3, 4), (2, 1, 4), (2, 3, 1, 4), (0, 3), (1,)]
UNARY = [
    "ReluGrad",
    "SigmoidGrad",
    "TanhGrad",
    "GeluGrad",
    "FastGeluGrad",
    "QuickGeluGrad",
    "LeakyReluGrad",
]


@pytest.mark.parametrize("shape", ELEMENTWISE_SHAPES, ids=str)
@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_elementwise_gradients(op, shape, symbolic):
    x = f32(*shape)
    if op in ("SigmoidGrad",):
        x = 1 / (1 + np.exp(-x))
    elif op in ("TanhGrad",):
        x = np.tanh(x)
    x = x.astype(np.float32)
    if op == "ReluGrad" and x.size:
        x.flat[0] = 0.0  # the kink
    attrs = {"alpha": 0.7} if op in ("QuickGeluGrad", "LeakyReluGrad") else {}
    assert check(Case(op, {"dY": f32(*shape), "X": x}, ["dX"], attrs), symbolic) == {op: 1}


@pytest.mark.parametrize("op", ["BiasGeluGrad_dX", "BiasFastGeluGrad_dX"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (0, 4)], ids=str)
def test_bias_gelu_gradients(op, shape):
    check(Case(op, {"dY": f32(*shape), "X": f32(*shape), "B": f32(shape[-1])}, ["dX"]))


@pytest.mark.parametrize("ratio", [None, 0.0, 0.25, 0.5], ids=str)
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4), (0, 2)], ids=str)
def test_dropout_grad(ratio, shape):
    inputs = {"dY": f32(*shape), "mask": RNG.uniform(size=shape) > 0.3}
    if ratio is not None:
        inputs["ratio"] = np.array(ratio, np.float32)
    check(Case("DropoutGrad", inputs, ["dX"]))


@pytest.mark.parametrize(
    "scale", [np.array([4], np.int64), np.array([2.5], np.float32), np.array(3, np.int64)], ids=str
)
@pytest.mark.parametrize("scale_down", [0, 1])
def test_scale(scale, scale_down):
    check(Case("Scale", {"X": f32(3, 4), "s": scale}, ["Y"], {"scale_down": scale_down}))


# ------------------------------------------------------------------ broadcasting
BROADCAST_PAIRS = [
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((2, 1, 4), (3, 1)),
    ((1,), (3,)),
    ((), (2, 2)),
    ((3, 4), (3, 4)),
    ((5,), (1, 1, 5)),
    ((1, 1), (1,)),
    ((2, 3, 1, 5), (3, 4, 1)),
]


@pytest.mark.parametrize(("a", "b"), BROADCAST_PAIRS, ids=str)
def test_broadcast_gradient_args_run_time(a, b):
    check(Case("BroadcastGradientArgs", {"a": i64(*a), "b": i64(*b)}, ["a_axes", "b_axes"]))


@pytest.mark.parametrize(("a", "b"), BROADCAST_PAIRS, ids=str)
def test_broadcast_gradient_args_known_shapes_fold_to_constants(a, b):
    """Shapes of values with known dims: the axes become constants, equal to the kernel's."""
    before = [helper.make_node("Shape", ["A"], ["a"]), helper.make_node("Shape", ["B"], ["b"])]
    case = Case(
        "BroadcastGradientArgs", {"A": f32(*a), "B": f32(*b)}, ["a_axes", "b_axes"], before=before
    )
    case.node_inputs = ["a", "b"]
    check(case)
    lowered = _model(case, symbolic=False)
    lower_training_ops(lowered)
    assert not any(n.op_type == "Compress" for n in lowered.graph.node)


SIZE_ONE_AT_RUN_TIME = [
    ((2, 1, 4), (2, 3, 4)),
    ((1, 1), (1,)),
    ((1, 3), (1, 1)),
    ((2, 0, 3), (1, 3)),
    ((1,), (1,)),
]


@pytest.mark.parametrize(("a", "b"), BROADCAST_PAIRS + SIZE_ONE_AT_RUN_TIME, ids=str)
def test_broadcast_gradient_args_symbolic_dims_are_checked_per_axis(a, b):
    """Every dim its own symbol: the ranks decide the leading axes, a few nodes check the rest, as the kernel does."""
    before = [helper.make_node("Shape", ["A"], ["a"]), helper.make_node("Shape", ["B"], ["b"])]
    case = Case(
        "BroadcastGradientArgs", {"A": f32(*a), "B": f32(*b)}, ["a_axes", "b_axes"], before=before
    )
    case.node_inputs = ["a", "b"]
    check(case, symbolic=True)
    lowered = _model(case, symbolic=True)
    lower_training_ops(lowered)
    ops = [n.op_type for n in lowered.graph.node]
    assert "Max" not in ops and "Range" not in ops, ops  # not the whole run-time computation
    assert ops.count("Compress") <= 2


@pytest.mark.parametrize(
    ("own", "other", "fixed", "checked"),
    [
        (["b", "s", 576], ["b", "s", 576], [], []),
        ([576], ["b", "s", 576], [1, 0], []),
        (["b", "s", 576], [576], [], []),
        ([1, 1, "s", 64], ["b", 9, "s", 64], [1], [(0, 0, 0)]),
        (["n", 4], [1, 4], [], []),
        ([1, 4], [1, "m"], [], []),
        ([1, 4], [0, 4], [0], []),
        ([None, 4], [None, 4], [], [(0, 0, 0)]),
        (["x", 3], ["y", 3], [], [(0, 0, 0)]),
    ],
)
def test_plan_reduction_decides_what_the_dims_decide(own, other, fixed, checked):
    from onnxblocks.portable.broadcast import plan_reduction

    assert plan_reduction(own, other) == (fixed, checked)


def test_types_behind_onnx_runtime_ops_are_found_for_broadcast_gradients():
    """What follows an op onnx shape inference does not know (``SimplifiedLayerNormalization``) gets its type anyway.

    ONNX Runtime's gradient graphs declare such values without a shape; the lowering
    finds the shape on the lowered (all-standard) graph, so the gradient reduction
    needs no run-time rank arithmetic. Its axes equal the kernel's.
    """
    x, scale, bias = f32(2, 3, 4), f32(4), f32(4)
    before = [
        helper.make_node("SimplifiedLayerNormalization", ["X", "S"], ["Y"], axis=-1, epsilon=1e-5),
        helper.make_node("Mul", ["Y", "Y"], ["Z"]),
        helper.make_node("Shape", ["Z"], ["z_shape"]),
        helper.make_node("Shape", ["Bias"], ["b_shape"]),
    ]
    case = Case(
        "BroadcastGradientArgs",
        {"X": x, "S": scale, "Bias": bias},
        ["a_axes", "b_axes"],
        before=before,
    )
    case.node_inputs = ["z_shape", "b_shape"]
    check(case, symbolic=True)
    lowered = _model(case, symbolic=True)
    lowered.graph.value_info.append(
        helper.make_tensor_value_info("Z", onnx.TensorProto.FLOAT, None)
    )
    lower_training_ops(lowered)
    ops = [n.op_type for n in lowered.graph.node]
    assert "Max" not in ops and "Range" not in ops, ops


@pytest.mark.parametrize(
    ("a", "b"),
    [((2, 3), (3,)), ((3,), (2, 3)), ((2, 3), ()), ((2, 1), (1, 3)), ((4,), (4,))],
    ids=str,
)
@pytest.mark.parametrize("outputs", [["dA", "dB"], ["", "dB"]], ids=["both", "dB"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_div_grad(a, b, outputs, symbolic):
    out = np.broadcast_shapes(a, b)
    divisor = f32(*b, low=0.5, high=2.0)
    check(
        Case("DivGrad", {"dY": f32(*out), "A": f32(*a), "B": divisor}, outputs, rtol=1e-5), symbolic
    )


# ------------------------------------------------------------------ matmul
@pytest.mark.parametrize(
    ("a", "b", "attrs"),
    [
        ((3, 4), (4, 5), {}),
        ((4, 3), (4, 5), {"transA": 1}),
        ((3, 4), (5, 4), {"transB": 1, "alpha": 0.5}),
        ((2, 4, 3), (2, 5, 4), {"transA": 1, "transB": 1}),
        ((2, 3, 4), (4, 5), {}),
        ((2, 3, 4), (3, 5), {"transA": 1}),
        ((2, 1, 3, 4), (3, 4, 5), {"alpha": 2.0}),
        ((0, 3, 4), (4, 2), {}),
    ],
    ids=str,
)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_fused_matmul(a, b, attrs, symbolic):
    check(Case("FusedMatMul", {"A": f32(*a), "B": f32(*b)}, ["Y"], attrs), symbolic)


def test_fused_matmul_of_unknown_rank_is_an_einsum():
    model = _model(
        Case("FusedMatMul", {"A": f32(2, 4, 3), "B": f32(2, 4, 5)}, ["Y"], {"transA": 1}), False
    )
    del model.graph.input[0].type.tensor_type.shape.dim[:]
    model.graph.input[0].type.tensor_type.ClearField("shape")
    expected = _run(
        model, {"A": np.ones((2, 4, 3), np.float32), "B": np.ones((2, 4, 5), np.float32)}
    )
    lower_training_ops(model)
    assert [n.op_type for n in model.graph.node] == ["Einsum"]
    got = _run(model, {"A": np.ones((2, 4, 3), np.float32), "B": np.ones((2, 4, 5), np.float32)})
    assert_equal(got[0], expected[0])  # sums of ones: exact in any order


# ------------------------------------------------------------------ softmax
@pytest.mark.parametrize(
    "op", ["SoftmaxGrad_13", "LogSoftmaxGrad_13", "SoftmaxGrad", "LogSoftmaxGrad"]
)
@pytest.mark.parametrize(
    ("shape", "axis"), [((4, 5), -1), ((2, 3, 4), 1), ((2, 3, 4), 0), ((1, 1, 3), -1)], ids=str
)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_softmax_gradients(op, shape, axis, symbolic):
    x = f32(*shape)
    reduce = (axis,) if op.endswith("_13") else tuple(range(axis % len(shape), len(shape)))
    y = np.exp(x - x.max(axis=reduce, keepdims=True))
    y = y / y.sum(axis=reduce, keepdims=True)
    y = (np.log(y) if op.startswith("Log") else y).astype(np.float32)
    check(Case(op, {"dY": f32(*shape), "Y": y}, ["dX"], {"axis": axis}), symbolic)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(np.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "weight"])
@pytest.mark.parametrize("ignore", [None, 1, -100], ids=str)
@pytest.mark.parametrize("shape", [(6, 4), (3, 4, 2), (1, 3)], ids=str)
def test_softmax_cross_entropy_loss_grad(reduction, weighted, ignore, shape):
    n, c, rest = shape[0], shape[1], shape[2:]
    labels = RNG.integers(0, c, (n, *rest)).astype(np.int64)
    if ignore is not None:
        labels.flat[0] = ignore
    dy = f32(n, *rest) if reduction == "none" else np.array(1.7, np.float32)
    inputs = {"dY": dy, "log_prob": _log_softmax(f32(*shape)), "label": labels}
    if weighted:
        inputs["weight"] = f32(c, low=0.1, high=2.0)
    attrs: dict[str, Any] = {"reduction": reduction} | (
        {"ignore_index": ignore} if ignore is not None else {}
    )
    check(Case("SoftmaxCrossEntropyLossGrad", inputs, ["dX"], attrs))


def test_softmax_cross_entropy_loss_grad_with_every_label_ignored():
    inputs = {
        "dY": np.array(1.0, np.float32),
        "log_prob": _log_softmax(f32(3, 4)),
        "label": i64(2, 2, 2),
    }
    check(
        Case(
            "SoftmaxCrossEntropyLossGrad", inputs, ["dX"], {"reduction": "mean", "ignore_index": 2}
        )
    )


# ------------------------------------------------------------------ normalisation
@pytest.mark.parametrize(
    ("shape", "axis"), [((4, 6), -1), ((2, 3, 5), -1), ((2, 3, 4), 1), ((1, 1, 4), 2)], ids=str
)
@pytest.mark.parametrize("simplified", [False, True], ids=["layer", "simplified"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_layer_norm_grad(shape, axis, simplified, symbolic):
    x = f32(*shape)
    axes = tuple(range(axis % len(shape), len(shape)))
    mean = x.mean(axis=axes, keepdims=True)
    centered = x if simplified else x - mean
    inv_std = (1 / np.sqrt((centered**2).mean(axis=axes, keepdims=True) + 1e-5)).astype(np.float32)
    inputs = {"dY": f32(*shape), "X": x, "scale": f32(*shape[axis % len(shape) :])}
    if simplified:
        inputs["inv_std"] = inv_std
        op, outputs = "SimplifiedLayerNormalizationGrad", ["dX", "dScale"]
    else:
        inputs["mean"], inputs["inv_std"] = mean.astype(np.float32), inv_std
        op, outputs = "LayerNormalizationGrad", ["dX", "dScale", "dBias"]
    check(Case(op, inputs, outputs, {"axis": axis, "epsilon": 1e-5}), symbolic)


BATCH_SHAPES = [(6, 3), (2, 3, 5), (2, 3, 4, 4), (1, 2, 3, 3)]


@pytest.mark.parametrize("shape", BATCH_SHAPES, ids=str)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_batch_norm_internal(shape, symbolic):
    c = shape[1]
    inputs = {
        "X": f32(*shape),
        "scale": f32(c),
        "B": f32(c),
        "mean": f32(c),
        "var": f32(c, low=0.5, high=1.5),
    }
    outputs = ["Y", "running_mean", "running_var", "saved_mean", "saved_inv_std"]
    check(Case("BatchNormInternal", inputs, outputs, {"epsilon": 1e-5, "momentum": 0.9}), symbolic)


@pytest.mark.parametrize("shape", BATCH_SHAPES, ids=str)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_batch_norm_grad(shape, symbolic):
    x = f32(*shape)
    axes = (0, *range(2, len(shape)))
    mean = x.mean(axis=axes).astype(np.float32)
    inv_std = (1 / np.sqrt(x.var(axis=axes) + 1e-5)).astype(np.float32)
    inputs = {"dY": f32(*shape), "X": x, "scale": f32(shape[1]), "mean": mean, "inv_std": inv_std}
    check(
        Case(
            "BatchNormalizationGrad", inputs, ["dX", "dScale", "dB"], {"epsilon": 1e-5}, rtol=1e-4
        ),
        symbolic,
    )


# ------------------------------------------------------------------ indexing
@pytest.mark.parametrize(
    ("data", "indices", "axis"),
    [
        ((5, 3), np.array([0, 2, 2, 4, -1]), 0),
        ((5, 3), np.array([[1, 1], [0, 4]]), 0),
        ((5,), np.array(3), 0),
        ((2, 5, 3), np.array([4, 0, 4]), 1),
        ((2, 3, 4), np.array([[3, 0], [1, 1]]), -1),
        ((4, 3), np.zeros((0,), np.int64), 0),
    ],
    ids=str,
)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_gather_grad(data, indices, axis, symbolic):
    indices = indices.astype(np.int64)
    out_shape = data[: axis % len(data)] + indices.shape + data[axis % len(data) + 1 :]
    inputs = {"shape": i64(*data), "indices": indices, "dY": f32(*out_shape)}
    check(Case("GatherGrad", inputs, ["dX"], {"axis": axis}), symbolic)


def test_gather_grad_with_int32_indices():
    inputs = {"shape": i64(4, 2), "indices": np.array([1, 1, 3], np.int32), "dY": f32(3, 2)}
    check(Case("GatherGrad", inputs, ["dX"], {"axis": 0}))


@pytest.mark.parametrize(
    ("data", "indices", "axis"),
    [((3, 4), (3, 2), 1), ((3, 4), (2, 4), 0), ((2, 3, 2), (2, 3, 1), -1)],
    ids=str,
)
def test_gather_elements_grad(data, indices, axis):
    index = RNG.integers(0, data[axis], indices).astype(np.int64)
    check(
        Case(
            "GatherElementsGrad",
            {"dY": f32(*indices), "shape": i64(*data), "indices": index},
            ["dX"],
            {"axis": axis},
        )
    )


def test_gather_nd_grad():
    index = np.array([[0, 1], [2, 0], [0, 1]], np.int64)
    check(
        Case(
            "GatherNDGrad",
            {"shape": i64(3, 2, 4), "indices": index, "dY": f32(3, 4)},
            ["dX"],
            {"batch_dims": 0},
        )
    )


@pytest.mark.parametrize(
    ("data", "starts", "ends", "axes", "steps"),
    [
        ((5, 4), [1], [4], [0], None),
        ((5, 4), [0, 1], [5, 3], None, None),
        ((5, 4), [-3], [100], [1], [1]),
        ((6, 4), [0], [6], [0], [2]),
        ((6, 4), [5], [-100], [0], [-2]),
        ((2, 3, 4), [1, 0], [3, 2], [2, 0], [1, 1]),
        ((3, 4), [2], [2], [0], None),
    ],
    ids=str,
)
def test_slice_grad(data, starts, ends, axes, steps):
    x = np.arange(np.prod(data)).reshape(data)
    index = [slice(None)] * len(data)
    for i, axis in enumerate(axes if axes is not None else range(len(starts))):
        index[axis] = slice(starts[i], ends[i], steps[i] if steps else 1)
    dy = f32(*x[tuple(index)].shape)
    inputs = {"dY": dy, "shape": i64(*data), "starts": i64(*starts), "ends": i64(*ends)}
    inputs["axes"] = i64(*axes) if axes is not None else None
    inputs["steps"] = i64(*steps) if steps is not None else None
    if inputs["steps"] is None:
        del inputs["steps"]
        if inputs["axes"] is None:
            del inputs["axes"]
    check(Case("SliceGrad", inputs, ["dX"]))


BIG = np.iinfo(np.int64).max


@pytest.mark.parametrize(
    ("data", "starts", "ends", "axes", "steps", "symbolic", "padded"),
    [
        ((2, 3, 4, 8), [0], [4], [-1], None, False, True),  # rotate_half's first half
        ((2, 3, 4, 8), [4], [BIG], [-1], [1], True, True),  # and its second
        ((2, 5, 6), [0], [-1], [1], None, True, True),  # a shift along a dynamic axis
        ((2, 5, 6), [-3], [0], [1], None, True, True),  # empty, from the end, dynamic
        ((2, 5, 6), [-100], [4], [1], None, True, True),  # a start clamped, dynamic
        ((2, 5, 6), [1, -100], [100, 3], [1, 2], [1, 1], False, True),  # bounds clamped
        ((3, 4), [2], [2], [0], None, False, True),  # an empty slice
        ((6, 4), [5], [-100], [0], [-2], False, False),  # a negative step: positions
    ],
    ids=str,
)
def test_slice_grad_of_a_unit_step_slice_is_a_pad(
    data, starts, ends, axes, steps, symbolic, padded
):
    """With constant axes and unit steps, ``SliceGrad`` becomes ``Pad`` (no int64 positions of the
    whole input), equal to the kernel; its margins are constants where the dims are static.
    """
    x = f32(*data)
    index = [slice(None)] * len(data)
    for i, axis in enumerate(axes):
        index[axis] = slice(starts[i], ends[i], steps[i] if steps else 1)
    dy = f32(*x[tuple(index)].shape)
    consts = {"starts": i64(*starts), "ends": i64(*ends), "axes": i64(*axes)}
    if steps is not None:
        consts["steps"] = i64(*steps)
    before = [helper.make_node("Shape", ["x"], ["shape"])] + [
        helper.make_node("Constant", [], [n], value=onnx.numpy_helper.from_array(v, n))
        for n, v in consts.items()
    ]
    case = Case(
        "SliceGrad",
        {"dY": dy, "x": x},
        ["dX"],
        before=before,
        node_inputs=["dY", "shape", *consts],
    )
    check(case, symbolic)
    lowered = _model(case, symbolic)
    lower_training_ops(lowered)
    ops = {n.op_type for n in lowered.graph.node}
    assert ("Pad" in ops, "ScatterND" in ops, "Range" in ops) == (padded, not padded, not padded)
    if padded and not symbolic:  # the margins are one constant
        assert not ops & {"Where", "Min", "Max", "Gather"}


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_training(axis):
    shapes = {0: [(1, 3), (2, 3)], 1: [(2, 1), (2, 4)], -1: [(2, 2), (2, 3)]}[axis]
    inputs = {f"x{i}": f32(*s) for i, s in enumerate(shapes)}
    check(Case("ConcatTraining", inputs, ["y", "lengths"], {"axis": axis}))


@pytest.mark.parametrize("opset", [12, 17])
def test_split_training(opset):
    check(
        Case(
            "SplitTraining",
            {"x": f32(6, 2), "split": i64(1, 3, 2)},
            ["a", "b", "c"],
            {"axis": 0},
            opset=opset,
        )
    )


# ------------------------------------------------------------------ convolution and pooling
CONVS = [
    ((2, 3, 7), (4, 3, 3), {}),
    ((2, 3, 7, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 9, 8), (6, 2, 3, 2), {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1]}),
    ((1, 2, 10, 10), (3, 2, 3, 3), {"dilations": [2, 2], "strides": [3, 2]}),
    ((2, 2, 8), (2, 1, 3), {"group": 2, "strides": [2], "pads": [0, 2]}),
    ((3, 1, 5, 5), (2, 1, 1, 1), {"auto_pad": "VALID"}),
    ((2, 3, 5, 5), (4, 3, 1, 1), {"auto_pad": "SAME_UPPER"}),
    ((3, 2, 5, 5), (2, 2, 1, 1), {"auto_pad": "SAME_UPPER"}),  # a 1x1 kernel: no pads
]
#: ``auto_pad=SAME_*`` with a kernel that pads: the training build's ConvGrad kernel ignores ``auto_pad`` (its
#: gradients are those of an unpadded convolution), so these are compared with torch's autograd.
SAME_CONVS = [
    ((2, 3, 6, 5), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER"}),
    ((2, 2, 6, 5), (2, 2, 2, 2), {"auto_pad": "SAME_LOWER", "dilations": [2, 1]}),
    ((2, 3, 7, 6), (4, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((2, 3, 7, 6), (4, 3, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    (
        (2, 4, 7, 6),
        (4, 1, 3, 3),
        {"auto_pad": "SAME_UPPER", "strides": [2, 2], "group": 4},
    ),  # depthwise
]


@pytest.mark.parametrize(("x", "w", "attrs"), CONVS, ids=str)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_conv_grad(x, w, attrs, symbolic):
    ort = onnxruntime()
    conv = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["Y"], **attrs)],
        "conv",
        [
            helper.make_tensor_value_info("X", 1, list(x)),
            helper.make_tensor_value_info("W", 1, list(w)),
        ],
        [helper.make_empty_tensor_value_info("Y")],
    )
    model = helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    xv, wv = f32(*x), f32(*w)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": xv, "W": wv}
    )
    attrs = {"kernel_shape": list(w[2:])} | attrs
    check(
        Case(
            "ConvGrad",
            {"dY": f32(*y[0].shape), "X": xv, "W": wv},
            ["dX", "dW", "dB"],
            attrs,
            rtol=1e-4,
        ),
        symbolic,
    )


def _same_pads(size: int, kernel: int, stride: int, dilation: int, upper: bool) -> tuple[int, int]:
    total = max(0, (-(-size // stride) - 1) * stride + (kernel - 1) * dilation + 1 - size)
    return (total // 2, total - total // 2) if upper else (total - total // 2, total // 2)


@pytest.mark.parametrize(("x", "w", "attrs"), SAME_CONVS, ids=str)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_conv_grad_with_same_padding_equals_torch(x, w, attrs, symbolic):
    import torch

    strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    group, upper = attrs.get("group", 1), attrs["auto_pad"] == "SAME_UPPER"
    (top, bottom), (left, right) = (
        _same_pads(x[2 + i], w[2 + i], strides[i], dilations[i], upper) for i in range(2)
    )

    def conv(xv, wv):
        padded = torch.nn.functional.pad(xv, [left, right, top, bottom])
        return torch.nn.functional.conv2d(
            padded, wv, stride=strides, dilation=dilations, groups=group
        )

    xv, wv = f32(*x), f32(*w)
    dy = f32(*conv(torch.from_numpy(xv), torch.from_numpy(wv)).shape)
    attrs = {"kernel_shape": list(w[2:])} | attrs
    case = Case("ConvGrad", {"dY": dy, "X": xv, "W": wv}, ["dX", "dW", "dB"], attrs)
    lowered = _model(case, symbolic)
    if symbolic and any(s > 1 for s in strides):
        # SAME pads with a stride depend on the input size: refused when it is known only at run time
        with pytest.raises(
            PortabilityError,
            match=r"auto_pad='SAME_\w+' with stride \d over a dim known only at run",
        ):
            lower_training_ops(lowered)
        return
    lower_training_ops(lowered)
    assert non_portable_ops(lowered) == []
    got = _run(lowered, {n: v for n, v in case.inputs.items() if v is not None})
    _compare_conv_grads(got, conv, xv, wv, dy, rtol=1e-4)


def _torch_conv_grads(
    conv, x: np.ndarray, w: np.ndarray, dy: np.ndarray, dtype
) -> list[np.ndarray]:
    """dX, dW, dB of ``conv`` in torch's ``dtype``."""
    xt = torch.from_numpy(x).to(dtype).requires_grad_()
    wt = torch.from_numpy(w).to(dtype).requires_grad_()
    dyt = torch.from_numpy(dy).to(dtype)
    conv(xt, wt).backward(dyt)
    return [xt.grad.numpy(), wt.grad.numpy(), dyt.sum(dim=(0, *range(2, dy.ndim))).numpy()]


def _compare_conv_grads(got, conv, x, w, dy, rtol: float) -> None:
    """Against torch in float32 and float64; a convolution is bilinear, so the same gradients of |x|, |w| and
    |dy| are the sums of |terms| of each element (the floor's scale)."""
    expected = _torch_conv_grads(conv, x, w, dy, torch.float32)
    expected64 = _torch_conv_grads(conv, x, w, dy, torch.float64)
    scales = _torch_conv_grads(conv, np.abs(x), np.abs(w), np.abs(dy), torch.float64)
    for name, g, e, e64, scale in zip(
        ["dX", "dW", "dB"], got, expected, expected64, scales, strict=True
    ):
        assert_close(g, e, e64, rtol=rtol, scale=scale, name=name)


@pytest.mark.parametrize(
    ("x", "w", "auto_pad", "dilation"),
    [((2, 3, 6, 5), (4, 3, 3, 3), "SAME_UPPER", 1), ((2, 3, 7), (2, 3, 4), "SAME_UPPER", 1),
     ((2, 2, 9), (2, 2, 4), "SAME_LOWER", 2), ((1, 2, 8), (3, 2, 2), "SAME_LOWER", 1)],
    ids=str,
)  # fmt: skip
def test_conv_grad_with_same_padding(x, w, auto_pad, dilation):
    """torch's padding="same" (TorchScript writes auto_pad=SAME_UPPER). torch is the oracle: 1.19.2's ConvGrad
    kernel ignores auto_pad (its gradients are those of an unpadded Conv)."""
    xv, wv = f32(*x), f32(*w)
    spatial = len(x) - 2
    dy = f32(*x[:1], w[0], *x[2:])
    total = [(k - 1) * dilation for k in w[2:]]
    small = [t // 2 for t in total]
    pads = [
        (h, t - h) if auto_pad == "SAME_UPPER" else (t - h, h)
        for t, h in zip(total, small, strict=True)
    ]
    convolve = torch.nn.functional.conv1d if spatial == 1 else torch.nn.functional.conv2d

    def conv(xt, wt):
        return convolve(
            torch.nn.functional.pad(xt, [p for pair in reversed(pads) for p in pair]),
            wt,
            dilation=dilation,
        )

    attrs = {"auto_pad": auto_pad, "kernel_shape": list(w[2:]), "dilations": [dilation] * spatial}
    model = _model(
        Case("ConvGrad", {"dY": dy, "X": xv, "W": wv}, ["dX", "dW", "dB"], attrs), symbolic=True
    )
    assert lower_training_ops(model) == {"ConvGrad": 1}
    _compare_conv_grads(_run(model, {"dY": dy, "X": xv, "W": wv}), conv, xv, wv, dy, rtol=1e-4)


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 3, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
        ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2]}),
        ((2, 2, 9), {"kernel_shape": [3], "strides": [1], "pads": [1, 1]}),
        ((1, 1, 5, 5), {"kernel_shape": [2, 2], "strides": [1, 1], "dilations": [2, 2]}),
        ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ],
    ids=str,
)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_max_pool_grad(shape, attrs, symbolic):
    forward = helper.make_node("MaxPool", ["X"], ["Y", "I"], **attrs)
    x = f32(*shape)
    (y,) = _forward(forward, x)
    case = Case(
        "MaxPoolGrad",
        {"dY": f32(*y.shape), "X": x},
        ["X_grad"],
        attrs,
        "",
        [forward],
        ["dY", "I"],
        rtol=1e-6,
    )
    check(case, symbolic)


def _forward(node: onnx.NodeProto, x: np.ndarray) -> list[np.ndarray]:
    graph = helper.make_graph(
        [node],
        "forward",
        [helper.make_tensor_value_info("X", 1, list(x.shape))],
        [helper.make_empty_tensor_value_info("Y")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return _run(model, {"X": x})


@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((2, 3, 8, 8), {"kernel_shape": [4, 4], "strides": [4, 4]}),
        ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1]}),
        (
            (1, 2, 6, 6),
            {
                "kernel_shape": [3, 3],
                "strides": [1, 1],
                "pads": [1, 1, 1, 1],
                "count_include_pad": 0,
            },
        ),
        (
            (1, 2, 6, 6),
            {
                "kernel_shape": [3, 3],
                "strides": [2, 2],
                "pads": [1, 1, 1, 1],
                "count_include_pad": 1,
            },
        ),
        ((2, 2, 9), {"kernel_shape": [2], "strides": [2]}),
    ],
    ids=str,
)
def test_average_pool_grad(shape, attrs):
    forward = helper.make_node("AveragePool", ["X"], ["Y"], **attrs)
    x = f32(*shape)
    (y,) = _forward(forward, x)
    case = Case(
        "AveragePoolGrad",
        {"Y_grad": f32(*y.shape), "X": x},
        ["X_grad"],
        attrs,
        "",
        [forward],
        ["Y_grad"],
    )
    check(case)


# ------------------------------------------------------------------ recurrent
def _recurrent_case(kind: str, before_reset: int, with_state: bool, final_grad: bool) -> Case:
    t, b, i, h = 4, 3, 2, 5
    gates = 3 if kind == "GRU" else 4
    inputs: dict[str, np.ndarray | None] = {
        "X": f32(t, b, i),
        "W": f32(1, gates * h, i, low=-0.6, high=0.6),
        "R": f32(1, gates * h, h, low=-0.6, high=0.6),
        "B": f32(1, 2 * gates * h, low=-0.3, high=0.3),
        "H0": f32(1, b, h) if with_state else None,
        "dY": f32(t, 1, b, h),
        "dY_h": f32(1, b, h) if final_grad else None,
    }
    attrs: dict[str, Any] = {"hidden_size": h}
    x, w, r, bias = "X", "W", "R", "B"
    h0 = "H0" if with_state else ""
    if kind == "GRU":
        attrs["linear_before_reset"] = before_reset
        forward = helper.make_node(
            "GRUTraining", [x, w, r, bias, "", h0], ["Y", "Y_h", "zrh"], domain=MS, **attrs
        )
        grad_inputs = [x, w, r, bias, "", h0, "Y", "zrh", "dY", "dY_h" if final_grad else ""]
        outputs = ["dX", "dW", "dR", "dB", "dH0" if with_state else ""]
        op = "GRUGrad"
    else:
        inputs["C0"] = f32(1, b, h) if with_state else None
        c0 = "C0" if with_state else ""
        forward = helper.make_node(
            "LSTMTraining",
            [x, w, r, bias, "", h0, c0],
            ["Y", "Y_h", "Y_c", "cells", "iofc"],
            domain=MS,
            **attrs,
        )
        grad_inputs = [
            x,
            w,
            r,
            "",
            h0,
            c0,
            "Y",
            "cells",
            "iofc",
            "dY",
            "dY_h" if final_grad else "",
            "",
        ]
        outputs = ["dX", "dW", "dR", "dB", "dH0" if with_state else "", "dC0" if with_state else ""]
        op = "LSTMGrad"
    named = [o for o in outputs if o]
    compare = ["Y", "Y_h", *(["Y_c"] if kind == "LSTM" else []), *named]
    case = Case(op, inputs, outputs, attrs, before=[forward], compare=compare, rtol=1e-4)
    case.grad_inputs = grad_inputs  # type: ignore[attr-defined]
    return case


RECURRENT = [
    (kind, before_reset, with_state, final_grad)
    for kind, before_reset in (
        ("GRU", 0),
        ("GRU", 1),
        ("LSTM", 0),
    )  # linear_before_reset is a GRU attribute
    for with_state in (False, True)
    for final_grad in (False, True)
]


@pytest.mark.parametrize(("kind", "before_reset", "with_state", "final_grad"), RECURRENT, ids=str)
def test_recurrent_training_and_grad(kind, before_reset, with_state, final_grad):
    case = _recurrent_case(kind, before_reset, with_state, final_grad)
    model = _model(case, symbolic=False)
    grad_node = model.graph.node[-1]
    del grad_node.input[:]
    grad_node.input.extend(case.grad_inputs)  # type: ignore[attr-defined]
    feeds = {
        n: v
        for n, v in case.inputs.items()
        if v is not None and n in {i.name for i in model.graph.input}
    }
    expected = _run(model, feeds)
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    counts = lower_training_ops(lowered)
    assert counts == {f"{kind}Training": 1, f"{kind}Grad": 1}
    assert non_portable_ops(lowered) == []
    for name, e, g in zip(case.compare or [], expected, _run(lowered, feeds), strict=True):
        assert_close(g, e, rtol=1e-4, name=name)


# ------------------------------------------------------------------ forward contrib ops (ONNX Runtime's fusions)
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (0, 4)], ids=str)
@pytest.mark.parametrize(
    ("op", "attrs", "bias"),
    [("Gelu", {}, False), ("FastGelu", {}, False), ("FastGelu", {}, True), ("BiasGelu", {}, True),
     ("QuickGelu", {}, False), ("QuickGelu", {"alpha": 0.8}, False)],
    ids=["gelu", "fast", "fast-bias", "bias", "quick", "quick-alpha"],
)  # fmt: skip
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_gelu_family_forward(op, attrs, bias, shape, symbolic):
    inputs = {"X": f32(*shape, low=-4, high=4)}
    if bias:
        inputs["B"] = f32(shape[-1])
    assert check(Case(op, inputs, ["Y"], attrs), symbolic) == {op: 1}


NORM_CASES = [((4, 6), -1), ((2, 3, 5), -1), ((2, 3, 4), 1), ((1, 1, 4), 2), ((0, 4), -1)]


@pytest.mark.parametrize(("shape", "axis"), NORM_CASES, ids=str)
@pytest.mark.parametrize("inv_std", [False, True], ids=["y", "inv_std"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_simplified_layer_norm(shape, axis, inv_std, symbolic):
    """RMSNorm (LLaMA, Qwen2, Mistral, T5): what ONNX Runtime's fusion writes while it builds the gradient."""
    scale = f32(*shape[axis:])
    case = Case(
        "SimplifiedLayerNormalization",
        {"X": f32(*shape), "scale": scale},
        ["Y", "inv_std_var" if inv_std else ""],
        {"axis": axis, "epsilon": 1e-6},
        domain="",
        compare=["Y", *(["inv_std_var"] if inv_std else [])],
    )
    assert check(case, symbolic) == {"SimplifiedLayerNormalization": 1}


@pytest.mark.parametrize(("shape", "axis"), NORM_CASES, ids=str)
@pytest.mark.parametrize("op", ["SimplifiedLayerNormalization", "LayerNormalization"])
def test_layer_norm_forwards_of_unknown_rank(op, shape, axis):
    """Behind other ONNX Runtime ops, shape inference knows no rank: the forms on X flattened at axis."""
    x, scale = f32(*shape), f32(*shape[axis:])
    outputs = ["Y", "inv_std"] if op.startswith("Simplified") else ["Y", "mean", "inv_std"]
    case = Case(op, {"X": x, "scale": scale}, outputs, {"axis": axis}, domain="", opset=16)
    expected = _run(_model(case, symbolic=False), {"X": x, "scale": scale})
    model = _model(case, symbolic=False)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    assert lower_training_ops(model) == {op: 1}
    assert non_portable_ops(model) == []
    for name, e, g in zip(outputs, expected, _run(model, {"X": x, "scale": scale}), strict=True):
        assert g.shape == e.shape, name
        assert_close(g, e, rtol=1e-5, name=name)


@pytest.mark.parametrize(("shape", "axis"), NORM_CASES[:4], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_layer_norm_below_opset_17(shape, axis, bias):
    """ONNX Runtime's own default-domain LayerNormalization, which its fusion writes at opsets below 17."""
    inputs = {"X": f32(*shape), "scale": f32(*shape[axis:])}
    if bias:
        inputs["B"] = f32(*shape[axis:])
    case = Case(
        "LayerNormalization", inputs, ["Y", "mean", "inv_std"], {"axis": axis}, domain="", opset=16
    )
    assert check(case) == {"LayerNormalization": 1}


SKIP_NORMS = [
    ("SkipLayerNormalization", beta, bias) for beta in (False, True) for bias in (False, True)
] + [("SkipSimplifiedLayerNormalization", False, False)]


@pytest.mark.parametrize(("op", "beta", "bias"), SKIP_NORMS, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 8), (4, 8)], ids=str)
def test_skip_layer_norm(op, beta, bias, shape):
    simplified = op.startswith("SkipSimplified")
    hidden = shape[-1]
    inputs: dict[str, np.ndarray | None] = {
        "input": f32(*shape),
        "skip": f32(*shape),
        "gamma": f32(hidden),
    }
    if not simplified:
        inputs["beta"] = f32(hidden) if beta else None
    inputs["bias"] = f32(hidden) if bias else None
    case = Case(op, inputs, ["Y", "", "", "sum"], {"epsilon": 1e-5}, compare=["Y", "sum"])
    assert check(case) == {op: 1}


def test_skip_simplified_layer_norm_adds_its_bias():
    """With a bias (input 3), as the op's schema says: 1.19.2's CPU kernel ignores it, so numpy is the oracle."""
    x, skip, gamma, bias = f32(2, 3, 8), f32(2, 3, 8), f32(8), f32(8)
    case = Case(
        "SkipSimplifiedLayerNormalization",
        {"input": x, "skip": skip, "gamma": gamma, "bias": bias},
        ["Y", "", "inv_std", "sum"],
        {"epsilon": 1e-5},
        compare=["Y", "inv_std", "sum"],
    )
    model = _model(case, symbolic=True)
    lower_training_ops(model)
    assert non_portable_ops(model) == []
    y, inv_std, total = _run(model, {"input": x, "skip": skip, "gamma": gamma, "bias": bias})
    expected, expected64 = (
        _skip_simplified(x, skip, gamma, bias, dtype) for dtype in (np.float32, np.float64)
    )
    terms = np.abs(x) + np.abs(skip) + np.abs(bias)
    assert_close(total, expected[0], expected64[0], rtol=1e-6, scale=terms, name="sum")
    assert_close(inv_std, expected[1], expected64[1], rtol=1e-5, name="inv_std")
    assert_close(y, expected[2], expected64[2], rtol=1e-5, name="Y")


def _skip_simplified(x, skip, gamma, bias, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sum, 1 / RMS and Y of SkipSimplifiedLayerNormalization in NumPy's ``dtype``."""
    total = x.astype(dtype) + skip.astype(dtype) + bias.astype(dtype)
    inv = 1 / np.sqrt(np.mean(total**2, axis=-1, keepdims=True) + dtype(1e-5))
    return total, inv, total * inv * gamma.astype(dtype)


def test_contrib_range_fused_gemm_and_fused_conv():
    bounds = {
        "start": np.array(2.0, np.float32),
        "limit": np.array(11.0, np.float32),
        "delta": np.array(3, np.float32),
    }
    check(Case("Range", bounds, ["Y"]))
    gemm = {"activation": "LeakyRelu", "activation_alpha": 0.2, "transB": 1, "alpha": 0.5}
    check(Case("FusedGemm", {"A": f32(3, 4), "B": f32(5, 4), "C": f32(5)}, ["Y"], gemm))
    conv = {"activation": "Relu", "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    check(Case("FusedConv", {"X": f32(1, 2, 5, 5), "W": f32(3, 2, 3, 3), "B": f32(3)}, ["Y"], conv))


def test_onnxruntime_mode_keeps_the_contrib_ops_stock_onnxruntime_runs():
    case = Case("Gelu", {"X": f32(3, 4)}, ["Y"])
    model = _model(case, symbolic=False)
    assert lower_training_ops(model, mode="onnxruntime") == {}
    assert [n.op_type for n in model.graph.node] == ["Gelu"] and non_portable_ops(
        model, "onnxruntime"
    ) == []
    assert [op for _, op, _ in non_portable_ops(model)] == ["Gelu"]
    rms = _model(
        Case("SimplifiedLayerNormalization", {"X": f32(2, 4), "s": f32(4)}, ["Y"], domain=""), False
    )
    assert (
        lower_training_ops(rms, mode="onnxruntime") == {}
        and non_portable_ops(rms, "onnxruntime") == []
    )


def test_contrib_trilu_below_opset_14_is_refused_in_standard_mode():
    case = Case("Trilu", {"X": f32(3, 3)}, ["Y"], opset=13)
    with pytest.raises(PortabilityError, match=r"Trilu.*opset 14.*imports opset 13"):
        lower_training_ops(_model(case, symbolic=False))
    kept = _model(case, symbolic=False)
    assert lower_training_ops(kept, mode="onnxruntime") == {}


# ------------------------------------------------------------------ errors and the table
def test_an_op_without_lowering_names_the_op_the_node_and_the_remedy():
    model = _model(Case("FooGrad", {"dY": f32(3)}, ["dX"]), False)
    with pytest.raises(
        PortabilityError, match=r"Node 'FooGrad_node' \(com\.microsoft:FooGrad\).*portable=False"
    ) as info:
        lower_training_ops(model)
    assert isinstance(info.value, ValueError)
    assert [n.op_type for n in model.graph.node] == ["FooGrad"]  # nothing half-rewritten


def test_a_lowering_that_needs_a_newer_opset_says_so():
    model = _model(
        Case(
            "GatherGrad", {"shape": i64(4, 2), "indices": i64(1), "dY": f32(1, 2)}, ["dX"], opset=13
        ),
        False,
    )
    with pytest.raises(
        PortabilityError, match=r"GatherGrad.*opset 16.*imports opset 13.*opset_version=17"
    ):
        lower_training_ops(model)


def test_non_portable_ops_lists_training_ops_and_contrib_ops_by_mode():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Gelu", ["a"], ["b"], domain=MS),
        helper.make_node("ReluGrad", ["b", "x"], ["c"], domain=MS),
        helper.make_node("MaxPoolGrad", ["c", "i"], ["d"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", 1, [2])],
        [helper.make_empty_tensor_value_info("d")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    )
    standard = [("Gelu", MS), ("ReluGrad", MS), ("MaxPoolGrad", "ai.onnx")]
    assert [(op, domain) for _, op, domain in non_portable_ops(model)] == standard
    assert [(op, domain) for _, op, domain in non_portable_ops(model, True)] == standard
    onnxruntime_mode = [("ReluGrad", MS), ("MaxPoolGrad", "ai.onnx")]
    assert [
        (op, domain) for _, op, domain in non_portable_ops(model, "onnxruntime")
    ] == onnxruntime_mode
    with pytest.raises(
        InvalidValueError, match=r"mode must be True, 'standard'.*'onnxruntime'.*not 'ort'"
    ):
        non_portable_ops(model, "ort")


#: Every op the test families' training models hold that is not portable (benchmarks/portable_ops.py lists them).
FOUND_IN_FAMILIES = {
    "AveragePoolGrad", "BatchNormInternal", "BatchNormalizationGrad", "BroadcastGradientArgs", "ConcatTraining",
    "ConvGrad", "DivGrad", "DropoutGrad", "GRUGrad", "GRUTraining", "GatherElementsGrad", "GatherGrad", "GeluGrad",
    "LSTMGrad", "LSTMTraining", "LayerNormalizationGrad", "MaxPoolGrad", "QuickGeluGrad", "ReluGrad", "Scale",
    "SliceGrad", "SoftmaxCrossEntropyLossGrad", "SoftmaxGrad_13", "SplitTraining", "TanhGrad", "FusedMatMul",
}  # fmt: skip


def test_every_op_found_in_the_families_has_a_lowering():
    assert FOUND_IN_FAMILIES <= set(LOWERINGS)
