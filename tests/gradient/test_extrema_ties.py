"""Min and max on ties: the gradients of ReduceMax/ReduceMin/Max/Min/ArgMax against torch, in every float dtype.

torch's rules, each checked here against torch itself:

* a full reduction (``torch.max(x)``) and ``amax`` / ``amin`` over any axes share the gradient
  evenly among the tied elements;
* ``torch.max(x, dim)`` / ``torch.min(x, dim)`` give it to the index they return (the first):
  a ``ReduceMax`` the dynamo exporter marks ``aten.max.dim``, or a one-axis ``ReduceMax`` without
  the dynamo exporter's record (torchscript writes ``amax(x, dim)`` and ``max(x, dim)`` alike);
* ``torch.maximum`` / ``torch.minimum`` give half to each input on a tie.

Each graph is differentiated by ``build_vjp_graph`` and run two ways: the training build (ONNX
Runtime's gradient kernels) and the portable lowering (standard ops only). Inputs and outputs are
float64 at the graph's edges and cast to the tested dtype inside (ONNX Runtime's Python API takes no
bfloat16 arrays); the values are small multiples of 1/4, exact in every dtype, so torch run on the
same values in the tested dtype is the reference and torch in float64 the float64 reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from support.numerics import assert_close, assert_equal, eps

from onnxblocks._core.ort import onnxruntime
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.portable import non_portable_ops
from onnxblocks.portable.lower import lower_training_ops

DTYPES = {
    "float16": (onnx.TensorProto.FLOAT16, torch.float16),
    "bfloat16": (onnx.TensorProto.BFLOAT16, torch.bfloat16),
    "float32": (onnx.TensorProto.FLOAT, torch.float32),
    "float64": (onnx.TensorProto.DOUBLE, torch.float64),
}
SHAPE = (3, 4, 5)
PATTERNS = ("all-equal", "few-ties", "no-ties")


def _values(pattern: str, seed: int, shape=SHAPE, dims=None, largest: bool = True) -> np.ndarray:
    """Multiples of 1/4 in [-8, 8), exact in float16 and bfloat16.

    ``few-ties``: distinct values, then the extremum of each slice over ``dims`` (all axes by
    default) copied to one or two other elements of its slice.
    """
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if pattern == "all-equal":
        return np.full(shape, 1.25)
    distinct = (rng.permutation(size) - size // 2).reshape(shape) / 4.0
    if pattern == "no-ties":
        return distinct
    dims = [d % len(shape) for d in (range(len(shape)) if dims is None else dims)]
    ends = list(range(len(shape) - len(dims), len(shape)))
    moved = np.moveaxis(distinct, dims, ends).copy()
    rows = moved.reshape(-1, int(np.prod([shape[d] for d in dims])))
    for row in rows:
        best = int(np.argmax(row) if largest else np.argmin(row))
        others = [j for j in range(row.size) if j != best]
        row[rng.choice(others, min(2, len(others)), replace=False)] = row[best]
    return np.moveaxis(rows.reshape(moved.shape), ends, dims)


def _model(nodes, inputs, outputs, elem, inits=(), opset=18) -> onnx.ModelProto:
    """``nodes`` between float64 edges: each input cast to ``elem``, each output back to float64."""
    casts_in = [helper.make_node("Cast", [name], [f"{name}_t"], to=elem) for name in inputs]
    casts_out = [
        helper.make_node("Cast", [f"{name}_t"], [name], to=onnx.TensorProto.DOUBLE)
        for name in outputs
    ]
    graph = helper.make_graph(
        casts_in + list(nodes) + casts_out,
        "g",
        [
            helper.make_tensor_value_info(name, onnx.TensorProto.DOUBLE, shape)
            for name, shape in inputs.items()
        ],
        [helper.make_tensor_value_info(name, onnx.TensorProto.DOUBLE, None) for name in outputs],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _mark(node: onnx.NodeProto, target: str) -> None:
    """Record ``target`` as the aten op ``node`` comes from, as the dynamo exporter does."""
    entry = node.metadata_props.add()
    entry.key, entry.value = (
        "pkg.torch.onnx.fx_node",
        f"%v : [num_users=1] = call_function[target=torch.ops.{target}](...)",
    )


def _run(
    model: onnx.ModelProto, feeds: dict, output: str, grad_out: np.ndarray, portable: bool
) -> dict:
    """The output and the gradients of the graph inputs, from the training build or the portable lowering."""
    others = [o.name for o in model.graph.output if o.name != output]
    vjp = build_vjp_graph(model, requires_grad=list(feeds), outputs=[output, *others])
    graph = vjp.model
    if portable:
        lower_training_ops(graph)
        assert not non_portable_ops(graph), [op for _, op, _ in non_portable_ops(graph)]
    session = onnxruntime().InferenceSession(
        graph.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    got = session.run(None, {**feeds, vjp.output_grads[0]: grad_out})
    return dict(zip(names, got, strict=True))


def _torch(fn, arrays: dict, grad_out: np.ndarray, dtype: torch.dtype):
    """``fn``'s output and gradients in torch, in ``dtype``."""
    xs = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in arrays.items()}
    out = fn(**xs)
    (out * torch.tensor(grad_out, dtype=dtype)).sum().backward()
    return out.detach(), {k: x.grad for k, x in xs.items()}


def _check(model, fn, arrays: dict, output: str, dtype: str, portable: bool, seed: int) -> None:
    torch_dtype = DTYPES[dtype][1]
    with torch.no_grad():
        shape = tuple(fn(**{k: torch.tensor(v) for k, v in arrays.items()}).shape)
    grad_out = np.asarray(
        np.random.default_rng(seed).integers(1, 16, size=shape) / 4.0, dtype=np.float64
    )
    got = _run(
        model, {k: v.astype(np.float64) for k, v in arrays.items()}, output, grad_out, portable
    )
    expected, grads = _torch(fn, arrays, grad_out, torch_dtype)
    expected64, grads64 = _torch(fn, arrays, grad_out, torch.float64)
    rtol = eps(dtype)  # one rounding of dy / k
    assert_close(got[output], expected, expected64, rtol=rtol, name="output")
    for name in arrays:
        assert_close(
            got[f"{name}_grad"], grads[name], grads64[name], rtol=rtol, name=f"gradient of {name}"
        )


REDUCTIONS = [  # (axes, keepdims); None: no axes input (every axis)
    (None, 0),
    (None, 1),
    ([1], 0),
    ([-1], 1),
    ([0, 2], 0),
    ([0, 1, 2], 1),
]


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("axes", "keepdims"), REDUCTIONS)
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reductions_share_ties_evenly_as_torch_amax(op, axes, keepdims, dtype, pattern, portable):
    inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if axes is not None else []
    node = helper.make_node(
        op, ["x_t", "axes"] if axes is not None else ["x_t"], ["y_t"], keepdims=keepdims
    )
    if (
        axes is not None and len(axes) == 1
    ):  # the dynamo exporter's amax; torchscript's reads as max(x, dim)
        _mark(node, "aten.amax.default" if op == "ReduceMax" else "aten.amin.default")
    model = _model([node], {"x": list(SHAPE)}, ["y"], DTYPES[dtype][0], inits)
    reduce = torch.amax if op == "ReduceMax" else torch.amin
    dims = list(range(len(SHAPE))) if axes is None else axes

    def fn(x):
        return reduce(x, dim=dims, keepdim=bool(keepdims))

    x = _values(pattern, 3, dims=dims, largest=op == "ReduceMax")
    _check(model, fn, {"x": x}, "y", dtype, portable, seed=4)


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("exporter", ["torchscript-values", "torchscript-indices", "dynamo"])
@pytest.mark.parametrize(("op", "axis", "keepdims"), [("ReduceMax", 1, 0), ("ReduceMin", -1, 1)])
def test_max_with_dim_gives_the_gradient_to_its_index(
    op, axis, keepdims, exporter, dtype, pattern, portable
):
    node = helper.make_node(op, ["x_t"], ["y_t"], axes=[axis], keepdims=keepdims)
    nodes = [node]
    if exporter == "torchscript-indices":  # both outputs of max(x, dim)
        arg = "ArgMax" if op == "ReduceMax" else "ArgMin"
        nodes.append(helper.make_node(arg, ["x_t"], ["i"], axis=axis, keepdims=keepdims))
    elif exporter == "dynamo":
        _mark(node, "aten.max.dim" if op == "ReduceMax" else "aten.min.dim")
    model = _model(nodes, {"x": list(SHAPE)}, ["y"], DTYPES[dtype][0], opset=17)
    if exporter == "torchscript-indices":
        model.graph.output.append(helper.make_tensor_value_info("i", onnx.TensorProto.INT64, None))
    select = torch.max if op == "ReduceMax" else torch.min

    def fn(x):
        return select(x, dim=axis, keepdim=bool(keepdims)).values

    x = _values(pattern, 5, dims=[axis], largest=op == "ReduceMax")
    _check(model, fn, {"x": x}, "y", dtype, portable, seed=6)


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("op", ["Max", "Min"])
def test_elementwise_extrema_give_half_to_each_tied_input(op, broadcast, dtype, pattern, portable):
    a = _values(pattern if pattern == "all-equal" else "no-ties", 7)
    b = _values(
        pattern if pattern == "all-equal" else "no-ties", 8, SHAPE[1:] if broadcast else SHAPE
    )
    if pattern == "no-ties":
        b = b + 0.125  # off the quarter grid a is on
    elif (
        pattern == "few-ties"
    ):  # every third element of b equals a's (the first row of a's, broadcast)
        b.reshape(-1)[::3] = a[0].reshape(-1)[::3] if broadcast else a.reshape(-1)[::3]
    node = helper.make_node(op, ["a_t", "b_t"], ["y_t"])
    model = _model([node], {"a": list(a.shape), "b": list(b.shape)}, ["y"], DTYPES[dtype][0])
    extremum = torch.maximum if op == "Max" else torch.minimum

    def fn(a, b):
        return extremum(a, b)

    _check(model, fn, {"a": a, "b": b}, "y", dtype, portable, seed=9)


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_extrema_run_in_every_dtype_with_torch_indices(op, dtype, portable):
    x = _values("few-ties", 10, dims=[1], largest=op == "ArgMax")
    node = helper.make_node(op, ["x_t"], ["i"], axis=1, keepdims=0)
    model = _model([node], {"x": list(SHAPE)}, [], DTYPES[dtype][0])
    model.graph.output.append(helper.make_tensor_value_info("i", onnx.TensorProto.INT64, None))
    # a float output for the vector-Jacobian graph to start from
    model.graph.node.append(helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("s", onnx.TensorProto.DOUBLE, None))
    got = _run(
        model, {"x": x}, "s", np.array(1.0), portable
    )  # "s" before "i": the one gradient seed
    expected = (torch.argmax if op == "ArgMax" else torch.argmin)(
        torch.tensor(x, dtype=DTYPES[dtype][1]), dim=1
    )
    assert_equal(got["i"], expected.numpy(), name="indices")


@pytest.mark.parametrize("portable", [False, True], ids=["training", "portable"])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_generated_artifacts_share_a_float16_tie_as_torch_max(op, portable, tmp_path):
    """ORTModule's minmax case through ``generate_artifacts``: a float32 weight, ``torch.max`` of float16 values."""
    from onnxblocks import OptimType, generate_artifacts
    from onnxblocks.runtime import TrainingSession

    w = (np.random.default_rng(12).integers(0, 3, size=(6, 8)) / 4.0).astype(
        np.float32
    )  # 16 elements tie
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("Cast", ["h"], ["h16"], to=onnx.TensorProto.FLOAT16),
        helper.make_node(op, ["h16"], ["m16"], keepdims=0),
        helper.make_node("Cast", ["m16"], ["loss"], to=onnx.TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [6, 8])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    generate_artifacts(
        model, ["w"], optimizer=OptimType.SGD, artifact_directory=tmp_path, portable=portable
    )
    x = np.ones((6, 8), np.float32)
    session = TrainingSession(tmp_path)
    session.train_step(x)
    reduce = torch.max if op == "ReduceMax" else torch.min

    def torch_grad(dtype: torch.dtype) -> torch.Tensor:
        wt = torch.tensor(
            w, dtype=torch.float64 if dtype == torch.float64 else torch.float32, requires_grad=True
        )
        reduce((torch.tensor(x, dtype=wt.dtype) * wt).to(dtype)).backward()
        return wt.grad

    expected = torch_grad(torch.float16)
    assert_close(
        session.gradients()["w"], expected, torch_grad(torch.float64), rtol=eps("float16"), name="w"
    )
    assert int((expected != 0).sum()) > 1  # the case is a tie
