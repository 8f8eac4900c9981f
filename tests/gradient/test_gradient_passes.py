"""The normalisation passes found by the exporter sweep, and the builder's early errors.

Each pass is checked two ways: the rewritten model computes the same forward
values as the original in ONNX Runtime, and gradients through the rewrite equal
torch's (``support.numerics``: rtol ``RTOL`` of torch in float32, or torch's own
float32 rounding against the same computation in float64, plus the floor).
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close, assert_equal
from support.passes import on_proto
from support.reference import Twice, twice

from onnxblocks.errors import GradientError, UnknownNameError
from onnxblocks.gradient import build_training_graphs, partition_parameters
from onnxblocks.gradient.activations import ActivationsAsElementary
from onnxblocks.gradient.conv_transpose import ConvTransposeAsConv
from onnxblocks.gradient.extrema import ExtremaWithTorchTies
from onnxblocks.gradient.group_norm import GroupNormAsElementary
from onnxblocks.gradient.indexing import (
    BorderPadAsGather,
    DepthToSpaceAsReshape,
    NegativeStepSliceAsGather,
)
from onnxblocks.gradient.layer_norm import LayerNormZeroBias
from onnxblocks.gradient.pooling import AveragePoolAsConv
from onnxblocks.gradient.recurrent import RecurrentAsElementary, RecurrentDirectionsAsForward
from onnxblocks.gradient.reductions import CumSumAsMatMul
from onnxblocks.gradient.resize import ResizeAsMatMul
from onnxblocks.gradient.rewrites import ExposeDropoutMask

activations_as_elementary = on_proto(ActivationsAsElementary)
average_pool_as_conv = on_proto(AveragePoolAsConv)
border_pad_as_gather = on_proto(BorderPadAsGather)
conv_transpose_as_conv = on_proto(ConvTransposeAsConv)
cumsum_as_matmul = on_proto(CumSumAsMatMul)
depth_to_space_as_reshape = on_proto(DepthToSpaceAsReshape)
expose_dropout_mask = on_proto(ExposeDropoutMask)
extrema_with_torch_ties = on_proto(ExtremaWithTorchTies)
group_norm_as_elementary = on_proto(GroupNormAsElementary)
layer_norm_zero_bias = on_proto(LayerNormZeroBias)
negative_step_slice_as_gather = on_proto(NegativeStepSliceAsGather)
recurrent_as_elementary = on_proto(RecurrentAsElementary)
recurrent_directions_as_forward = on_proto(RecurrentDirectionsAsForward)
resize_as_matmul = on_proto(ResizeAsMatMul)

RTOL = 1e-5


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 19 else 10
    return model


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _run(model, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _rewritten(model, rewrite, expected=1):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert rewrite(copy) == expected
    return copy


def _assert_same_forward(model, rewrite, feeds, expected=1):
    rewritten = _rewritten(model, rewrite, expected)
    for i, (got, want) in enumerate(zip(_run(rewritten, feeds), _run(model, feeds), strict=True)):
        # the model before and after: two graphs of ours, neither the truth (rtol and the floor)
        assert_close(got, want, rtol=1e-5, name=f"output {i} after the rewrite")
    return rewritten


def _torch(f, weights: np.ndarray, *arrays: np.ndarray) -> Twice:
    """``f(*arrays)`` and the gradients of ``sum(f(*arrays) * weights)`` w.r.t. each array, by torch autograd in
    float32 and in float64: ``(value, [gradient, ...])``."""

    def compute(weights, *tensors):
        y = f(*tensors)
        (y * weights).sum().backward()
        return y, [t.grad for t in tensors]

    return twice(
        compute, torch.from_numpy(weights), *(torch.from_numpy(a).requires_grad_() for a in arrays)
    )


def _shape(f, *arrays: np.ndarray) -> tuple[int, ...]:
    """The shape of ``f(*arrays)`` in torch."""
    with torch.no_grad():
        return tuple(f(*(torch.from_numpy(a) for a in arrays)).shape)


def _with_loss(model, output, weights):
    """``loss = ReduceSum(output * weights)``: a scalar whose gradient is ``weights``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.initializer.append(numpy_helper.from_array(weights, "loss_weights"))
    m.graph.node.extend(
        [
            helper.make_node("Mul", [output, "loss_weights"], ["weighted"]),
            helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0),
        ]
    )
    del m.graph.output[:]
    m.graph.output.append(_vi("loss", [], TensorProto.FLOAT))
    return m


def _gradients(model, feeds, params, wrt):
    """Run the training model of ``model`` (loss first output); return the gradients of ``wrt``."""
    graphs = build_training_graphs(model, wrt)
    feeds = dict(feeds)
    buffers = {}
    for name, value in params.items():
        feeds[name] = value
        if name in wrt:
            buffers[name] = np.zeros_like(value)
            feeds[f"{name}_grad.accumulation.buffer"] = buffers[name]
    feeds["lazy_reset_grad"] = np.array([True])
    outputs = dict(
        zip(
            [o.name for o in graphs.training.graph.output],
            _run(graphs.training, feeds),
            strict=True,
        )
    )
    return {n: buffers[n] if n in buffers else outputs[f"{n}_grad"] for n in wrt}, graphs


# ------------------------------------------------------------------ activations
ACTIVATIONS = [
    ("Elu", {"alpha": 0.7}, lambda x: F.elu(x, 0.7)),
    ("Celu", {"alpha": 0.5}, lambda x: F.celu(x, 0.5)),
    ("Selu", {}, F.selu),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, F.hardsigmoid),
    ("HardSwish", {}, F.hardswish),
    ("Mish", {}, F.mish),  # ai.onnx opset 18
    ("ThresholdedRelu", {"alpha": 0.3}, lambda x: torch.where(x > 0.3, x, torch.zeros_like(x))),
    ("Shrink", {"lambd": 0.4, "bias": 0.4}, lambda x: F.softshrink(x, 0.4)),
    ("Shrink", {"lambd": 0.4}, lambda x: F.hardshrink(x, 0.4)),
    ("Softsign", {}, F.softsign),
    ("Sign", {}, lambda x: torch.sign(x) * x),  # the model multiplies too (below): d/dx = sign(x)
]


@pytest.mark.parametrize(
    ("op", "attrs", "reference"),
    ACTIVATIONS,
    ids=[f"{a[0]}-{i}" for i, a in enumerate(ACTIVATIONS)],
)
def test_activation_rewrite_keeps_values_and_matches_torch_gradient(op, attrs, reference):
    x = (
        np.concatenate([np.linspace(-4, 4, 33), [0.0, 1e-3, -1e-3, 25.0, -25.0]])
        .astype(np.float32)
        .reshape(2, -1)
    )
    nodes = [helper.make_node(op, ["x"], ["y"], **attrs)]
    if op == "Sign":  # Sign alone has no path to differentiate; sign(x) * x has gradient sign(x)
        nodes = [helper.make_node(op, ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    model = _model(nodes, [_vi("x", ["N", x.shape[1]])], [_vi("y", ["N", x.shape[1]])], opset=18)
    _assert_same_forward(model, activations_as_elementary, {"x": x})
    weights = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    grads, _ = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    _torch(reference, weights, x)[1][0].check(grads["x"], rtol=RTOL, name="x's gradient")


def test_prelu_rewrite_gives_the_slope_its_gradient():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3, 0.4], np.float32).reshape(4, 1)
    model = _model(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        [_vi("x", ["N", 4, 2])],
        [_vi("y", ["N", 4, 2])],
        [numpy_helper.from_array(slope, "slope")],
    )
    _assert_same_forward(model, activations_as_elementary, {"x": x})
    weights = rng.standard_normal(x.shape).astype(np.float32)
    grads, _ = _gradients(
        _with_loss(model, "y", weights), {"x": x}, {"slope": slope}, ["slope", "x"]
    )
    want = _torch(F.prelu, weights, x, slope.reshape(4))[1]
    want[1].check(grads["slope"].reshape(4), rtol=RTOL, name="the slope's gradient")
    want[0].check(grads["x"], rtol=RTOL, name="x's gradient")


# ------------------------------------------------------------------ dropout, layer norm
def test_dropout_gets_a_mask_output_and_trains():
    model = _model(
        [
            helper.make_node(
                "Constant", [], ["ratio"], value=numpy_helper.from_array(np.array(0.0, np.float32))
            ),
            helper.make_node(
                "Constant", [], ["train"], value=numpy_helper.from_array(np.array(True))
            ),
            helper.make_node("Mul", ["x", "w"], ["h"]),
            helper.make_node("Dropout", ["h", "ratio", "train"], ["y"]),
        ],
        [_vi("x", ["N", 3])],
        [_vi("y", ["N", 3])],
        [numpy_helper.from_array(np.ones(3, np.float32) * 2, "w")],
    )
    rewritten = _rewritten(model, expose_dropout_mask)
    dropout = next(n for n in rewritten.graph.node if n.op_type == "Dropout")
    assert len(dropout.output) == 2 and dropout.output[1]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    weights = np.ones((2, 3), np.float32)
    grads, _ = _gradients(
        _with_loss(model, "y", weights), {"x": x}, {"w": np.ones(3, np.float32) * 2}, ["w"]
    )
    assert_equal(
        grads["w"], x.sum(axis=0), name="w's gradient"
    )  # ratio 0: the identity; small integers, exact


@pytest.mark.parametrize("static_scale", [True, False])
def test_layer_norm_without_bias_gets_zeros_and_matches_torch(static_scale):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, 5).astype(np.float32)
    if static_scale:
        nodes = [
            helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-5)
        ]
        inits = [numpy_helper.from_array(scale, "scale")]
        inputs = [_vi("x", ["N", 5])]
        feeds, params = {"x": x}, {}
    else:  # a scale of unknown shape: the zeros come from ConstantOfShape(Shape(scale))
        nodes = [
            helper.make_node("Identity", ["s"], ["scale"]),
            helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-5),
        ]
        inits = []
        inputs = [_vi("x", ["N", 5]), _vi("s", ["D"])]
        feeds, params = {"x": x, "s": scale}, {}
    model = _model(nodes, inputs, [_vi("y", ["N", 5])], inits)
    _assert_same_forward(model, layer_norm_zero_bias, feeds)
    weights = rng.standard_normal(x.shape).astype(np.float32)
    wrt = ["scale", "x"] if static_scale else ["s", "x"]
    grads, _ = _gradients(
        _with_loss(model, "y", weights),
        feeds if not static_scale else {"x": x},
        {"scale": scale} if static_scale else params,
        wrt,
    )
    want = _torch(lambda x, s: F.layer_norm(x, (5,), s), weights, x, scale)[1]
    want[1].check(grads[wrt[0]], rtol=RTOL, name="the scale's gradient")
    want[0].check(grads["x"], rtol=RTOL, name="x's gradient")


# ------------------------------------------------------------------ pooling
POOLS = [  # kernel, stride, pad, ceil_mode, count_include_pad
    (2, 2, 0, 0, 1),
    (3, 2, 1, 0, 1),
    (3, 2, 1, 0, 0),
    (3, 2, 0, 1, 0),
    (3, 3, 1, 1, 0),
    (2, 1, 1, 0, 0),
]


@pytest.mark.parametrize(("kernel", "stride", "pad", "ceil", "include"), POOLS)
def test_average_pool_with_dynamic_batch_becomes_conv_with_torch_gradients(
    kernel, stride, pad, ceil, include
):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    node = helper.make_node(
        "AveragePool",
        ["x"],
        ["y"],
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad] * 4,
        ceil_mode=ceil,
        count_include_pad=include,
    )
    model = _model([node], [_vi("x", ["N", 3, 7, 6])], [_vi("y", None)])
    _assert_same_forward(model, average_pool_as_conv, {"x": x})

    def pool(x):
        return F.avg_pool2d(
            x, kernel, stride, pad, ceil_mode=bool(ceil), count_include_pad=bool(include)
        )

    weights = rng.standard_normal(_shape(pool, x)).astype(np.float32)
    # ONNX Runtime's AveragePoolGrad would crash the process here (dynamic batch)
    grads, graphs = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    assert graphs.rewrites["average_pool_as_conv"] == 1
    _torch(pool, weights, x)[1][0].check(grads["x"], rtol=RTOL, name="x's gradient")


def test_static_float_average_pool_is_left_to_onnxruntime():
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    model = _model([node], [_vi("x", [2, 3, 4, 4])], [_vi("y", None)])
    assert average_pool_as_conv(model) == 0


def test_max_pool_with_dynamic_spatial_dims_is_a_clear_error():
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    model = _model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node(
                "MaxPool", ["c"], ["m"], kernel_shape=[2, 2], strides=[2, 2], name="pool"
            ),
            helper.make_node("ReduceSum", ["m"], ["loss"], keepdims=0),
        ],
        [_vi("x", ["N", 1, "H", "W"])],
        [_vi("loss", [])],
        [w],
    )
    with pytest.raises(
        GradientError, match=r"'pool' \(MaxPool\).*'c' of shape \['N', 2, .*static channel"
    ):
        build_training_graphs(model, ["w"])
    model.graph.input[0].CopyFrom(_vi("x", ["N", 1, 8, 8]))  # a dynamic batch is fine
    build_training_graphs(model, ["w"])


# ------------------------------------------------------------------ ConvTranspose
CONV_TRANSPOSE = [  # dims, kernel, stride, pad, output_padding, dilation, groups
    (1, 3, 2, 1, 1, 1, 1),
    (1, 3, 2, 2, 1, 1, 2),
    (2, 3, 2, 1, 1, 1, 1),
    (2, 2, 3, 0, 2, 1, 2),
    (2, 3, 1, 2, 0, 2, 1),
    (2, 3, 2, 3, 0, 1, 1),
    (2, 1, 1, 0, 0, 1, 4),
]


@pytest.mark.parametrize(
    ("dims", "kernel", "stride", "pad", "out_pad", "dilation", "groups"), CONV_TRANSPOSE
)
def test_conv_transpose_becomes_conv_with_torch_values_and_gradients(
    dims, kernel, stride, pad, out_pad, dilation, groups
):
    rng = np.random.default_rng(4)
    size = [5] * dims
    x = rng.standard_normal([2, 4, *size]).astype(np.float32)
    weight = rng.standard_normal([4, 6 // groups if groups != 4 else 1, *[kernel] * dims]).astype(
        np.float32
    )
    bias = rng.standard_normal(weight.shape[1] * groups).astype(np.float32)
    node = helper.make_node(
        "ConvTranspose",
        ["x", "w", "b"],
        ["y"],
        kernel_shape=[kernel] * dims,
        strides=[stride] * dims,
        pads=[pad] * 2 * dims,
        output_padding=[out_pad] * dims,
        dilations=[dilation] * dims,
        group=groups,
    )
    model = _model(
        [node],
        [_vi("x", ["N", 4, *size])],
        [_vi("y", None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    rewritten = _rewritten(model, conv_transpose_as_conv)
    fn = F.conv_transpose1d if dims == 1 else F.conv_transpose2d

    def conv_transpose(x, w, b):
        return fn(
            x,
            w,
            b,
            stride=stride,
            padding=pad,
            output_padding=out_pad,
            groups=groups,
            dilation=dilation,
        )

    weights = rng.standard_normal(_shape(conv_transpose, x, weight, bias)).astype(np.float32)
    want = _torch(conv_transpose, weights, x, weight, bias)
    # a sum of x w products plus b: the floor from the same sum of |x| |w| plus |b|
    terms = conv_transpose(
        *(torch.from_numpy(np.abs(a)).double() for a in (x, weight, bias))
    ).numpy()
    want[0].check(_run(rewritten, {"x": x})[0], rtol=1e-5, scale=terms, name="y")
    grads, _ = _gradients(
        _with_loss(model, "y", weights), {"x": x}, {"w": weight, "b": bias}, ["w", "b", "x"]
    )
    for i, name in enumerate(("x", "w", "b")):
        want[1][i].check(grads[name], rtol=RTOL, name=f"{name}'s gradient")


def test_conv_transpose_with_output_shape_is_a_clear_error():
    weight = numpy_helper.from_array(np.ones((2, 2, 3, 3), np.float32), "w")
    node = helper.make_node(
        "ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2], output_shape=[9, 9]
    )
    model = _model(
        [node, helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)],
        [_vi("x", [1, 2, 4, 4])],
        [_vi("loss", [])],
        [weight],
    )
    with pytest.raises(
        GradientError, match=r"no CPU kernel for float for ConvTransposeGrad.*'up'.*output_shape"
    ):
        build_training_graphs(model, ["w"])


# ------------------------------------------------------------------ instance / group norm
@pytest.mark.parametrize(
    ("op", "groups", "opset"),
    [
        ("InstanceNormalization", None, 17),
        ("GroupNormalization", 2, 21),
        ("GroupNormalization", 2, 18),
    ],
)
def test_group_norms_become_elementary_with_torch_values_and_gradients(op, groups, opset):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    per_group = op == "GroupNormalization" and opset < 21
    n_affine = groups if per_group else 4
    scale = rng.uniform(0.5, 1.5, n_affine).astype(np.float32)
    bias = rng.standard_normal(n_affine).astype(np.float32)
    attrs = {"epsilon": 1e-3} | ({"num_groups": groups} if groups else {})
    model = _model(
        [helper.make_node(op, ["x", "scale", "bias"], ["y"], **attrs)],
        [_vi("x", ["N", 4, "H", 5])],
        [_vi("y", None)],
        [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(bias, "bias")],
        opset=opset,
    )
    rewritten = _rewritten(model, group_norm_as_elementary)

    def group_norm(x, s, b):
        if per_group:  # opset-18 GroupNormalization: affine per group
            s, b = s.repeat_interleave(2), b.repeat_interleave(2)
        return F.group_norm(x, groups or 4, s, b, eps=1e-3)

    weights = rng.standard_normal(x.shape).astype(np.float32)
    want = _torch(group_norm, weights, x, scale, bias)
    want[0].check(_run(rewritten, {"x": x})[0], rtol=1e-5, name="y")
    grads, _ = _gradients(
        _with_loss(model, "y", weights),
        {"x": x},
        {"scale": scale, "bias": bias},
        ["scale", "bias", "x"],
    )
    for i, name in enumerate(("x", "scale", "bias")):
        want[1][i].check(grads[name], rtol=RTOL, name=f"{name}'s gradient")


# ------------------------------------------------------------------ recurrent
def _recurrent_model(
    op,
    direction,
    hidden=3,
    steps=4,
    bias=True,
    initial=True,
    peepholes=False,
    elem=TensorProto.FLOAT,
    dynamic_steps=False,
    **attrs,
):
    rng = np.random.default_rng(6)
    dirs = 2 if direction == "bidirectional" else 1
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    arrays = {
        "W": rng.standard_normal((dirs, gates * hidden, 2)),
        "R": rng.standard_normal((dirs, gates * hidden, hidden)),
        "B": rng.standard_normal((dirs, 2 * gates * hidden)) if bias else None,
        "h0": rng.standard_normal((dirs, 2, hidden)) if initial else None,
        "c0": rng.standard_normal((dirs, 2, hidden)) if initial and op == "LSTM" else None,
        "P": rng.standard_normal((dirs, 3 * hidden)) if peepholes else None,
    }
    inits = [
        numpy_helper.from_array((0.5 * a).astype(dtype), n)
        for n, a in arrays.items()
        if a is not None
    ]
    inputs = ["x", "W", "R", "B" if bias else "", "", "h0" if initial else ""]
    if op == "LSTM":
        inputs += ["c0" if initial else "", "P" if peepholes else ""]
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, inputs, outputs, hidden_size=hidden, direction=direction, **attrs)
    model = _model(
        [node],
        [_vi("x", ["T" if dynamic_steps else steps, "N", 2], elem)],
        [_vi(o, None, elem) for o in outputs],
        inits,
    )
    x = rng.standard_normal((steps, 2, 2)).astype(dtype)
    return model, x


RECURRENT = [
    ("GRU", "bidirectional", {"linear_before_reset": 1}),
    ("GRU", "reverse", {}),
    ("LSTM", "bidirectional", {}),
    ("LSTM", "reverse", {"peepholes": True}),
    ("RNN", "bidirectional", {"activations": ["Relu", "Tanh"]}),
    ("GRU", "bidirectional", {"dynamic_steps": True}),
]


@pytest.mark.parametrize(("op", "direction", "options"), RECURRENT)
def test_reverse_directions_become_forward_nodes_with_same_values(op, direction, options):
    options = dict(options)
    model, x = _recurrent_model(op, direction, peepholes=options.pop("peepholes", False), **options)
    rewritten = _assert_same_forward(model, recurrent_directions_as_forward, {"x": x})
    assert {_direction(n) for n in rewritten.graph.node if n.op_type == op} == {b"forward"}


def _direction(node):
    return next(a.s for a in node.attribute if a.name == "direction")


UNROLLED = [
    ("RNN", {}),
    ("RNN", {"activations": ["Relu"], "bias": False, "initial": False}),
    ("GRU", {"linear_before_reset": 1, "elem": TensorProto.DOUBLE}),
    ("GRU", {"elem": TensorProto.DOUBLE}),
    ("GRU", {"initial": False, "bias": False, "elem": TensorProto.DOUBLE}),
    ("LSTM", {"peepholes": True, "elem": TensorProto.DOUBLE}),
    ("LSTM", {"initial": False, "elem": TensorProto.DOUBLE}),
]


@pytest.mark.parametrize(("op", "options"), UNROLLED)
def test_rnn_and_non_float_recurrences_unroll_with_same_values(op, options):
    model, x = _recurrent_model(op, "forward", **options)
    rewritten = _rewritten(model, recurrent_as_elementary)
    # ONNX Runtime runs GRU / LSTM in float32 only: the reference is the float32 model
    reference, _ = _recurrent_model(op, "forward", **{**options, "elem": TensorProto.FLOAT})
    got, want = _run(rewritten, {"x": x}), _run(reference, {"x": x.astype(np.float32)})
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(
            g, w, rtol=1e-5, name=f"output {i}"
        )  # ours against ours: rtol and the float32 floor


def test_float_gru_and_dynamic_length_rnn_are_not_unrolled():
    model, _ = _recurrent_model("GRU", "forward")
    assert recurrent_as_elementary(model) == 0  # ONNX Runtime's GRUTraining handles it
    model, _ = _recurrent_model("RNN", "forward", dynamic_steps=True)
    assert recurrent_as_elementary(model) == 0


def test_rnn_gradient_matches_torch_after_unrolling():
    torch.manual_seed(0)
    rnn = torch.nn.RNN(2, 3, num_layers=1, bidirectional=True)
    x = np.random.default_rng(7).standard_normal((4, 2, 2)).astype(np.float32)
    params = {n: p.detach().numpy() for n, p in rnn.named_parameters()}

    def stack(kind):
        return np.stack([params[f"{kind}_l0"], params[f"{kind}_l0_reverse"]])

    inits = [
        numpy_helper.from_array(stack("weight_ih"), "W"),
        numpy_helper.from_array(stack("weight_hh"), "R"),
        numpy_helper.from_array(np.concatenate([stack("bias_ih"), stack("bias_hh")], axis=1), "B"),
    ]
    node = helper.make_node(
        "RNN", ["x", "W", "R", "B"], ["y"], hidden_size=3, direction="bidirectional"
    )
    model = _model([node], [_vi("x", [4, "N", 2])], [_vi("y", None)], inits)
    weights = np.random.default_rng(8).standard_normal((4, 2, 2, 3)).astype(np.float32)

    def rnn_gradients(rnn, x, weights):
        y, _ = rnn(x)  # [T, B, 2H]; ONNX: [T, 2, B, H]
        (y.reshape(4, 2, 2, 3).transpose(1, 2) * weights).sum().backward()
        w = torch.stack([rnn.weight_ih_l0.grad, rnn.weight_ih_l0_reverse.grad])
        b_ih = torch.stack([rnn.bias_ih_l0.grad, rnn.bias_ih_l0_reverse.grad])
        b_hh = torch.stack([rnn.bias_hh_l0.grad, rnn.bias_hh_l0_reverse.grad])
        return w, torch.cat([b_ih, b_hh], dim=1)

    want = twice(rnn_gradients, rnn, torch.from_numpy(x), torch.from_numpy(weights))
    grads, graphs = _gradients(
        _with_loss(model, "y", weights),
        {"x": x},
        {i.name: numpy_helper.to_array(i) for i in inits},
        ["W", "R", "B"],
    )
    assert graphs.rewrites["recurrent_as_elementary"] == 2
    want[0].check(grads["W"], rtol=RTOL, name="W's gradient")
    want[1].check(grads["B"], rtol=RTOL, name="B's gradient")


# ------------------------------------------------------------------ builder: types, names
def test_double_loss_of_float_parameters_gets_a_float_seed():
    rng = np.random.default_rng(9)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    model = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Cast", ["y"], ["y64"], to=TensorProto.DOUBLE),
            helper.make_node("Mul", ["y64", "y64"], ["sq"]),
            helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
        ],
        [_vi("x", ["N", 3])],
        [_vi("loss", [], TensorProto.DOUBLE)],
        [numpy_helper.from_array(w, "w")],
    )
    grads, graphs = _gradients(model, {"x": x}, {"w": w}, ["w"])
    want, want64 = (
        2 * a.T @ (a @ b) for a, b in ((x, w), (x.astype(np.float64), w.astype(np.float64)))
    )
    terms = (
        2 * np.abs(x.astype(np.float64)).T @ (np.abs(x) @ np.abs(w))
    )  # the magnitude of the products summed
    assert_close(grads["w"], want, want64, rtol=1e-5, scale=terms, name="w's gradient")
    assert graphs.training.graph.output[0].name == "loss"
    assert graphs.training.graph.output[0].type.tensor_type.elem_type == TensorProto.DOUBLE


def test_double_trainable_parameters_are_a_clear_type_error():
    model = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("ReduceSum", ["y"], ["loss"]),
        ],
        [_vi("x", ["N", 3], TensorProto.DOUBLE)],
        [_vi("loss", [1], TensorProto.DOUBLE)],
        [numpy_helper.from_array(np.ones((3, 2)), "w")],
    )
    with pytest.raises(TypeError, match=r"'w' are double.*InPlaceAccumulatorV2.*float32"):
        build_training_graphs(model, ["w"])


def test_unknown_name_error_mentions_tied_parameters():
    model = _model(
        [helper.make_node("MatMul", ["x", "lm_head.weight"], ["y"])],
        [_vi("x", ["N", 3])],
        [_vi("y", None)],
        [numpy_helper.from_array(np.ones((3, 2), np.float32), "lm_head.weight")],
    )
    with pytest.raises(UnknownNameError, match="tied weights"):
        partition_parameters(model.graph, ["wte.weight"], [])


def test_every_new_pass_leaves_an_unrelated_model_alone():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 3])], [_vi("y", None)])
    passes = [
        activations_as_elementary,
        average_pool_as_conv,
        border_pad_as_gather,
        conv_transpose_as_conv,
        expose_dropout_mask,
        group_norm_as_elementary,
        layer_norm_zero_bias,
        negative_step_slice_as_gather,
        recurrent_as_elementary,
        recurrent_directions_as_forward,
        extrema_with_torch_ties,
        resize_as_matmul,
        cumsum_as_matmul,
        depth_to_space_as_reshape,
    ]
    for rewrite, _ in itertools.product(passes, [0]):
        before = model.SerializeToString()
        assert rewrite(model) == 0
        assert model.SerializeToString() == before


# ------------------------------------------------------------------ LayerNormalization scale/bias constants
@pytest.mark.parametrize(
    "variant", ["constants", "shared_constants", "shared_frozen", "shared_one_trainable"]
)
def test_chained_layer_norms_with_constant_or_shared_scale_and_bias_match_torch(variant):
    """ONNX Runtime alone fails here with "Duplicate definition of name (<bias>_grad)"."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    s1, s2 = rng.uniform(0.5, 1.5, (2, 6)).astype(np.float32)
    b1, b2 = rng.standard_normal((2, 6)).astype(np.float32)
    if variant != "constants":
        s2, b2 = s1, b1
    arrays = {"w": w, "s1": s1, "b1": b1} | ({"s2": s2, "b2": b2} if variant == "constants" else {})
    second = ["s2", "b2"] if variant == "constants" else ["s1", "b1"]
    model = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h0"]),
            helper.make_node("LayerNormalization", ["h0", "s1", "b1"], ["h"], epsilon=1e-5),
            helper.make_node("LayerNormalization", ["h", *second], ["y"], epsilon=1e-5),
        ],
        [_vi("x", ["N", 6])],
        [_vi("y", ["N", 6])],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )
    weights = rng.standard_normal(x.shape).astype(np.float32)
    wrt = ["w", "s1"] if variant == "shared_one_trainable" else ["w"]
    frozen = ["s1", "b1"] if variant == "shared_frozen" else []
    graphs = build_training_graphs(_with_loss(model, "y", weights), wrt, frozen)
    feeds = {"x": x, "lazy_reset_grad": np.array([True])}
    buffers = {n: np.zeros_like(arrays[n]) for n in wrt}
    for name in graphs.partition.parameters:
        feeds[name] = arrays[name]
    feeds |= {f"{n}_grad.accumulation.buffer": b for n, b in buffers.items()}
    _run(graphs.training, feeds)

    def chained(w, s1, x, b1, s2, b2):
        h = F.layer_norm(x @ w, (6,), s1, b1)
        return F.layer_norm(h, (6,), s1 if variant != "constants" else s2, b2)

    want = _torch(chained, weights, w, s1, x, b1, s2, b2)[1]
    want[0].check(buffers["w"], rtol=RTOL, name="w's gradient")
    if "s1" in buffers:
        want[1].check(buffers["s1"], rtol=RTOL, name="s1's gradient")


# ------------------------------------------------------------------ negative-step Slice, border Pad
SLICES = [
    (-1, -(2**63), -1, 3),
    (4, 0, -2, 2),
    (-2, -5, -1, -1),
    (10, -100, -3, 2),
]  # start, end, step, axis


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(("start", "end", "step", "axis"), SLICES)
def test_negative_step_slice_becomes_gather_with_numpy_gradients(start, end, step, axis, dynamic):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array([v], np.int64), n)
        for n, v in (("s", start), ("e", end), ("a", axis), ("st", step))
    ]
    model = _model(
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])],
        [_vi("x", ["N", 3, "H" if dynamic else 5, "W" if dynamic else 6])],
        [_vi("y", None)],
        inits,
    )
    _assert_same_forward(model, negative_step_slice_as_gather, {"x": x})
    index = [slice(None)] * 4
    index[axis] = slice(start, end, step)
    weights = rng.standard_normal(x[tuple(index)].shape).astype(np.float32)
    expected = np.zeros_like(x)
    np.add.at(expected, tuple(index), weights)
    # ONNX Runtime's own SliceGrad fails with "narrowing_error" for a negative step
    grads, _ = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    assert_equal(
        grads["x"], expected, name="x's gradient"
    )  # each element picked once: the weight itself


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(
    ("mode", "torch_mode"), [("reflect", "reflect"), ("edge", "replicate"), ("wrap", "circular")]
)
def test_border_pad_becomes_gather_with_torch_values_and_gradients(mode, torch_mode, dynamic):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    model = _model(
        [helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)],
        [_vi("x", ["N", 3, "H" if dynamic else 5, 6])],
        [_vi("y", None)],
        [numpy_helper.from_array(np.array(pads, np.int64), "p")],
        opset=19,
    )
    rewritten = _rewritten(model, border_pad_as_gather)

    def pad(x):
        return F.pad(x, [pads[3], pads[7], pads[2], pads[6]], mode=torch_mode)

    weights = rng.standard_normal(_shape(pad, x)).astype(np.float32)
    want = _torch(pad, weights, x)
    assert_equal(_run(rewritten, {"x": x})[0], want.value[0], name="y")  # copies of x: exact
    grads, _ = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    want[1][0].check(grads["x"], rtol=RTOL, name="x's gradient")


# ------------------------------------------------------------------ Resize, ReduceMax / ReduceMin
@pytest.mark.parametrize(
    ("mode", "torch_mode", "transform", "scale"),
    [
        ("nearest", "nearest", "asymmetric", 2.0),
        ("linear", "bilinear", "pytorch_half_pixel", 2.0),
        ("linear", "bilinear", "align_corners", 1.5),
        ("cubic", "bicubic", "half_pixel", 2.0),
    ],
)
def test_resize_becomes_matmul_with_onnxruntime_values_and_torch_gradients(
    mode, torch_mode, transform, scale
):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    attrs = {"mode": mode, "coordinate_transformation_mode": transform} | (
        {"nearest_mode": "floor"}
        if mode == "nearest"
        else {"cubic_coeff_a": -0.75}
        if mode == "cubic"
        else {}
    )
    model = _model(
        [helper.make_node("Resize", ["x", "roi", "scales"], ["y"], **attrs)],
        [_vi("x", ["N", 3, 5, 6])],
        [_vi("y", None)],
        [
            numpy_helper.from_array(np.array([], np.float32), "roi"),
            numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales"),
        ],
    )
    _assert_same_forward(model, resize_as_matmul, {"x": x})

    def interpolate(x):
        corners = {"align_corners": transform == "align_corners"} if mode != "nearest" else {}
        return F.interpolate(x, scale_factor=scale, mode=torch_mode, **corners)

    weights = rng.standard_normal(_shape(interpolate, x)).astype(np.float32)
    grads, graphs = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    assert graphs.rewrites["resize_as_matmul"] == 1  # ONNX Runtime has no CPU ResizeGrad
    if (
        mode != "cubic"
    ):  # torch's bicubic reads clamped borders; ONNX Runtime's values are checked above
        _torch(interpolate, weights, x)[1][0].check(grads["x"], rtol=RTOL, name="x's gradient")


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize(
    ("op", "axes", "keepdims"),
    [
        ("ReduceMax", [1], 0),
        ("ReduceMax", [-1], 1),
        ("ReduceMin", [1, 3], 1),
        ("ReduceMax", [], 0),
    ],
)
def test_reduce_max_and_min_become_selections_with_torch_gradients(op, axes, keepdims, opset):
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    if opset >= 18:
        node = helper.make_node(op, ["x", "axes"] if axes else ["x"], ["y"], keepdims=keepdims)
        inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if axes else []
    else:
        node = helper.make_node(
            op, ["x"], ["y"], keepdims=keepdims, **({"axes": axes} if axes else {})
        )
        inits = []
    model = _model([node], [_vi("x", ["N", 3, 4, 5])], [_vi("y", None)], inits, opset=opset)
    _assert_same_forward(model, extrema_with_torch_ties, {"x": x})

    def extremum(x):
        return (torch.amax if op == "ReduceMax" else torch.amin)(
            x, dim=axes or [0, 1, 2, 3], keepdim=bool(keepdims)
        )

    weights = rng.standard_normal(_shape(extremum, x)).astype(np.float32)
    grads, _ = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    _torch(extremum, weights, x)[1][0].check(grads["x"], rtol=RTOL, name="x's gradient")


# ------------------------------------------------------------------ CumSum, DepthToSpace / SpaceToDepth
@pytest.mark.parametrize(
    ("axis", "exclusive", "reverse"), [(-1, 0, 0), (1, 1, 0), (2, 0, 1), (-1, 1, 1)]
)
def test_cumsum_becomes_matmul_with_torch_gradients(axis, exclusive, reverse):
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    model = _model(
        [helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
        [_vi("x", ["N", 3, 4])],
        [_vi("y", None)],
        [numpy_helper.from_array(np.array(axis, np.int64), "axis")],
    )
    _assert_same_forward(model, cumsum_as_matmul, {"x": x})

    def cumsum(x):
        y = (
            torch.flip(torch.cumsum(torch.flip(x, [axis]), axis), [axis])
            if reverse
            else torch.cumsum(x, axis)
        )
        return y - x if exclusive else y

    weights = rng.standard_normal(x.shape).astype(np.float32)
    grads, _ = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    _torch(cumsum, weights, x)[1][0].check(grads["x"], rtol=RTOL, name="x's gradient")


@pytest.mark.parametrize(
    ("op", "mode"), [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", None)]
)
def test_depth_to_space_becomes_reshape_transpose_with_numpy_gradients(op, mode):
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 8, 4, 6)).astype(np.float32)
    attrs = {"blocksize": 2} | ({"mode": mode} if mode else {})
    model = _model(
        [helper.make_node(op, ["x"], ["y"], **attrs)], [_vi("x", ["N", 8, 4, 6])], [_vi("y", None)]
    )
    _assert_same_forward(model, depth_to_space_as_reshape, {"x": x})
    (reference,) = _run(model, {"x": x})
    weights = rng.standard_normal(reference.shape).astype(np.float32)
    # a permutation: the gradient is the weights moved back, i.e. the op's inverse applied to them
    inverse = {"DepthToSpace": "SpaceToDepth", "SpaceToDepth": "DepthToSpace"}[op]
    if op == "DepthToSpace" and mode == "CRD":
        expected = torch.nn.functional.pixel_unshuffle(torch.from_numpy(weights), 2).numpy()
    else:
        back = _model(
            [helper.make_node(inverse, ["w"], ["g"], blocksize=2)],
            [_vi("w", None)],
            [_vi("g", None)],
        )
        (expected,) = _run(back, {"w": weights})
    grads, _ = _gradients(_with_loss(model, "y", weights), {"x": x}, {}, ["x"])
    assert_equal(grads["x"], expected, name="x's gradient")  # a permutation of the weights: exact
