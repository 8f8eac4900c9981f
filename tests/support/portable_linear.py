"""A portable artifact directory written by hand, per docs/portable.md: ``y = x @ W + b`` with a mean MSE loss.

Its gradient, accumulation, AdamW (torch mode) and fused step are written in
standard ONNX ops here, so the portable runtime can be tested without the
generator, and on stock onnxruntime under any Python (this module needs only
numpy, onnx and onnxblocks.checkpoint). ``python portable_linear.py DIR``
writes one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxblocks._core.contracts import (
    FIRST_ORDER_MOMENTS,
    GRADIENTS,
    LAZY_RESET_GRAD,
    LEARNING_RATE,
    PARAMS,
    PORTABLE_METADATA,
    SECOND_ORDER_MOMENTS,
    STEP,
    accumulated_name,
    buffer_name,
    gradient_name,
    moment_names,
    updated_name,
)
from onnxblocks.checkpoint import save_checkpoint

IN, OUT = 3, 2
PARAM_NAMES = ["W", "b"]
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.999), 1e-8, 0.01
F = TensorProto.FLOAT


def initial_parameters(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "W": rng.standard_normal((IN, OUT)).astype(np.float32),
        "b": rng.standard_normal(OUT).astype(np.float32),
    }


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "linear", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    helper.set_model_props(model, {PORTABLE_METADATA: "1"})
    onnx.checker.check_model(model)
    return model


def _forward(nodes: list, w: str, b: str) -> None:
    nodes += [
        helper.make_node("MatMul", ["x", w], ["xw"]),
        helper.make_node("Add", ["xw", b], ["y"]),
        helper.make_node("Sub", ["y", "target"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["loss"], keepdims=0),
    ]


def _backward(nodes: list, suffix: str = "") -> tuple[str, str]:
    """dloss/dW and dloss/db of the mean squared error (``d = y - target``)."""
    nodes += [
        helper.make_node("Size", ["d"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=F),
        helper.make_node("Div", ["two", "nf"], ["scale"]),
        helper.make_node("Mul", ["d", "scale"], ["dy"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        helper.make_node("MatMul", ["xt", "dy"], ["gW" + suffix]),
        helper.make_node("ReduceSum", ["dy", "axis0"], ["gb" + suffix], keepdims=0),
    ]
    return "gW" + suffix, "gb" + suffix


def _gradient_constants() -> list[TensorProto]:
    return [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]


def _adamw_constants() -> list[TensorProto]:
    return [
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(BETAS[0], np.float32), "beta1"),
        numpy_helper.from_array(np.array(BETAS[1], np.float32), "beta2"),
        numpy_helper.from_array(np.array(1 - BETAS[0], np.float32), "one_minus_beta1"),
        numpy_helper.from_array(np.array(1 - BETAS[1], np.float32), "one_minus_beta2"),
        numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
        numpy_helper.from_array(np.array(WEIGHT_DECAY, np.float32), "weight_decay"),
    ]


def _adamw(nodes: list, p: str, g: str, m: str, v: str, tag: str) -> tuple[str, str, str]:
    """torch.optim.AdamW on one tensor; ``lr`` and ``stepf`` (float step) must exist."""
    t = f"{tag}."
    nodes += [
        helper.make_node("Mul", ["lr", "weight_decay"], [t + "lrwd"]),
        helper.make_node("Sub", ["one", t + "lrwd"], [t + "decay"]),
        helper.make_node("Mul", [p, t + "decay"], [t + "pd"]),
        helper.make_node("Mul", [m, "beta1"], [t + "m1"]),
        helper.make_node("Mul", [g, "one_minus_beta1"], [t + "m2"]),
        helper.make_node("Add", [t + "m1", t + "m2"], [t + "m"]),
        helper.make_node("Mul", [g, g], [t + "gg"]),
        helper.make_node("Mul", [v, "beta2"], [t + "v1"]),
        helper.make_node("Mul", [t + "gg", "one_minus_beta2"], [t + "v2"]),
        helper.make_node("Add", [t + "v1", t + "v2"], [t + "v"]),
        helper.make_node("Pow", ["beta1", "stepf"], [t + "b1t"]),
        helper.make_node("Sub", ["one", t + "b1t"], [t + "bc1"]),
        helper.make_node("Pow", ["beta2", "stepf"], [t + "b2t"]),
        helper.make_node("Sub", ["one", t + "b2t"], [t + "bc2"]),
        helper.make_node("Sqrt", [t + "v"], [t + "sv"]),
        helper.make_node("Sqrt", [t + "bc2"], [t + "sbc2"]),
        helper.make_node("Div", [t + "sv", t + "sbc2"], [t + "den0"]),
        helper.make_node("Add", [t + "den0", "eps"], [t + "den"]),
        helper.make_node("Div", ["lr", t + "bc1"], [t + "stepsize"]),
        helper.make_node("Div", [t + "m", t + "den"], [t + "ratio"]),
        helper.make_node("Mul", [t + "ratio", t + "stepsize"], [t + "upd"]),
        helper.make_node("Sub", [t + "pd", t + "upd"], [t + "p"]),
    ]
    return t + "p", t + "m", t + "v"


def _scalars(nodes: list) -> None:
    nodes += [
        helper.make_node("Squeeze", [LEARNING_RATE], ["lr"]),
        helper.make_node("Cast", [STEP], ["stepv"], to=F),
        helper.make_node("Squeeze", ["stepv"], ["stepf"]),
    ]


def _vi(name: str, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _seq(name: str):
    return helper.make_tensor_sequence_value_info(name, F, None)


def _sequence_optimizer() -> onnx.ModelProto:
    """AdamW over tensor sequences (the first portable layout)."""
    nodes: list = []
    _scalars(nodes)
    outs: dict[str, list[str]] = {PARAMS: [], FIRST_ORDER_MOMENTS: [], SECOND_ORDER_MOMENTS: []}
    for i, p in enumerate(PARAM_NAMES):
        pos = f"pos{i}"
        got = {}
        for seq in (PARAMS, GRADIENTS, FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS):
            got[seq] = f"{seq}.{i}"
            nodes.append(helper.make_node("SequenceAt", [seq, pos], [got[seq]]))
        new = _adamw(
            nodes,
            got[PARAMS],
            got[GRADIENTS],
            got[FIRST_ORDER_MOMENTS],
            got[SECOND_ORDER_MOMENTS],
            p,
        )
        for seq, value in zip(outs, new, strict=True):
            outs[seq].append(value)
    for seq, values in outs.items():
        nodes.append(helper.make_node("SequenceConstruct", values, [updated_name(seq)]))
    positions = [
        numpy_helper.from_array(np.array(i, np.int64), f"pos{i}") for i in range(len(PARAM_NAMES))
    ]
    return _model(
        nodes,
        [
            _vi(LEARNING_RATE, [1]),
            _vi(STEP, [1], TensorProto.INT64),
            *(_seq(s) for s in (PARAMS, GRADIENTS, FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS)),
        ],
        [_seq(updated_name(s)) for s in outs],
        [*_adamw_constants(), *positions],
    )


def _per_tensor_optimizer(shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """AdamW with one tensor input and output per parameter, gradient and moment (docs/portable.md)."""
    nodes: list = []
    _scalars(nodes)
    inputs = [_vi(LEARNING_RATE, [1]), _vi(STEP, [1], TensorProto.INT64)]
    outputs = []
    for p in PARAM_NAMES:
        m, v = moment_names(p)
        inputs += [_vi(n, shapes[p]) for n in (p, gradient_name(p), m, v)]
        new = _adamw(nodes, p, gradient_name(p), m, v, p)
        for name, value in zip((p, m, v), new, strict=True):
            nodes.append(helper.make_node("Identity", [value], [updated_name(name)]))
            outputs.append(_vi(updated_name(name), shapes[p]))
    return _model(nodes, inputs, outputs, _adamw_constants())


def write(
    directory: str | Path, fused: bool = True, seed: int = 0, sequence_optimizer: bool = False
) -> Path:
    """Write the artifacts (training, eval, optimizer, step model when ``fused``, checkpoint) into ``directory``.

    The optimizer model takes one tensor per parameter, gradient and moment; with
    ``sequence_optimizer``, tensor sequences instead (the first portable layout, which
    the runtime refuses).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shapes = {"W": [IN, OUT], "b": [OUT]}
    data_inputs = [_vi("x", ["N", IN]), _vi("target", ["N", OUT])]
    param_inputs = [_vi(p, shapes[p]) for p in PARAM_NAMES]
    user_outputs = [_vi("loss", []), _vi("y", ["N", OUT])]

    nodes: list = []
    _forward(nodes, "W", "b")
    grads = _backward(nodes)
    for p, g in zip(PARAM_NAMES, grads, strict=True):
        nodes += [
            helper.make_node("Add", [buffer_name(p), g], [f"{p}.sum"]),
            helper.make_node("Where", [LAZY_RESET_GRAD, g, f"{p}.sum"], [accumulated_name(p)]),
        ]
    training = _model(
        nodes,
        [
            *data_inputs,
            *param_inputs,
            *(_vi(buffer_name(p), shapes[p]) for p in PARAM_NAMES),
            _vi(LAZY_RESET_GRAD, [1], TensorProto.BOOL),
        ],
        [*user_outputs, *(_vi(accumulated_name(p), shapes[p]) for p in PARAM_NAMES)],
        _gradient_constants(),
    )
    nodes = []
    _forward(nodes, "W", "b")
    evaluation = _model(nodes, [*data_inputs, *param_inputs], user_outputs)

    optimizer = _sequence_optimizer() if sequence_optimizer else _per_tensor_optimizer(shapes)
    models = {"training_model": training, "eval_model": evaluation, "optimizer_model": optimizer}
    if fused:
        nodes = []
        _scalars(nodes)
        _forward(nodes, "W", "b")
        grads = _backward(nodes)
        step_outputs = []
        for p, g in zip(PARAM_NAMES, grads, strict=True):
            m, v = moment_names(p)
            new = _adamw(nodes, p, g, m, v, p)
            for name, value in zip((p, m, v), new, strict=True):
                nodes.append(helper.make_node("Identity", [value], [updated_name(name)]))
                step_outputs.append(_vi(updated_name(name), shapes[p]))
        models["step_model"] = _model(
            nodes,
            [
                *data_inputs,
                _vi(LEARNING_RATE, [1]),
                _vi(STEP, [1], TensorProto.INT64),
                *(_vi(n, shapes[p]) for p in PARAM_NAMES for n in (p, *moment_names(p))),
            ],
            [*user_outputs, *step_outputs],
            [*_gradient_constants(), *_adamw_constants()],
        )
    for name, model in models.items():
        onnx.save(model, str(directory / f"{name}.onnx"))
    save_checkpoint((initial_parameters(seed), {}), directory / "checkpoint")
    return directory


def forward_model() -> onnx.ModelProto:
    """The forward model ``y = x @ W + b`` with the initial parameters, for training-build artifacts of the same run."""
    params = initial_parameters()
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "linear",
        [_vi("x", ["N", IN])],
        [_vi("y", ["N", OUT])],
        [numpy_helper.from_array(v, n) for n, v in params.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def batches(steps: int, rows: int = 8, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((rows, IN)).astype(np.float32),
            rng.standard_normal((rows, OUT)).astype(np.float32),
        )
        for _ in range(steps)
    ]


if __name__ == "__main__":
    print(write(sys.argv[1]))
