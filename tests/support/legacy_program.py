"""A training program written against ONNX Runtime's pre-1.15 API, and its references (torch.optim, a NumPy Lamb).

:func:`legacy_program` is the program as old scripts wrote it (``TrainingParameters``,
``TrainingSession(bytes, parameters)``, ``run`` with a changing learning rate, then
``get_state``); only its import changed. Run as a script (Python 3.13, stock
onnxruntime), it reads ``{"cases": [...], "out": dir}`` as JSON on stdin, runs each case
and writes ``<out>/<case>.npz`` (losses and state), printing one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STEPS = 20
SIZES = (4, 8, 1)


def lr_at(step: int) -> float:
    """The changing learning rate of the program's step ``step`` (0-based)."""
    return 0.02 * (1.0 + 0.5 * np.cos(step / 3.0))


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    a, h, o = SIZES
    return {
        "W1": (rng.standard_normal((a, h)) * 0.7).astype(np.float32),
        "b1": (rng.standard_normal(h) * 0.1).astype(np.float32),
        "W2": (rng.standard_normal((h, o)) * 0.7).astype(np.float32),
        "b2": np.zeros(o, np.float32),
    }


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    x = rng.standard_normal((16, SIZES[0])).astype(np.float32)
    return x, (np.sin(x.sum(1, keepdims=True)) * 3.0).astype(np.float32)


def mlp_with_loss(tag: str = "") -> onnx.ModelProto:
    """An MLP whose graph ends in its MSE loss (outputs: loss, pred); ``tag`` changes the bytes only."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["pred"]),
        helper.make_node("Sub", ["pred", "y"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SIZES[0]]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", SIZES[2]]),
        ],
        [
            helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("pred", TensorProto.FLOAT, ["N", SIZES[2]]),
        ],
        [numpy_helper.from_array(v, k) for k, v in weights().items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.doc_string = tag
    return model


#: The cases: optimizer, float attributes, int attributes, gradient accumulation steps.
CASES: dict[str, tuple[str, dict, dict, int]] = {
    "adam": ("AdamOptimizer", {}, {"do_bias_correction": 1}, 1),
    "adam-lambda": (
        "AdamOptimizer",
        {"lambda": 0.05, "epsilon": 1e-7},
        {"weight_decay_mode": 0},
        1,
    ),
    "sgd": ("SGDOptimizer", {}, {}, 1),
    "lamb": ("LambOptimizer", {"lambda": 0.01}, {}, 1),
    "adam-accumulate-4": ("AdamOptimizer", {}, {"do_bias_correction": 1}, 4),
}


def legacy_program(case: str, tag: str = "") -> tuple[list[float], dict[str, np.ndarray], str]:
    """The legacy program; returns its losses, its final ``get_state()`` and its artifacts directory."""
    from onnxblocks.compat.legacy import (
        TrainingParameters,
        TrainingSession,
    )  # was: from onnxruntime import ...

    optimizer, floats, ints, accumulate = CASES[case]
    model = mlp_with_loss(tag)
    names = [init.name for init in model.graph.initializer]
    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.weights_to_train = set(names)
    parameters.training_optimizer_name = optimizer
    parameters.lr_params_feed_name = "Learning_Rate"
    parameters.optimizer_attributes_map = {name: dict(floats) for name in names}
    parameters.optimizer_int_attributes_map = {name: dict(ints) for name in names}
    parameters.gradient_accumulation_steps = accumulate
    parameters.world_rank = 0
    parameters.world_size = 1
    parameters.use_mixed_precision = False
    session = TrainingSession(model.SerializeToString(), parameters)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        feeds = {"x": x, "y": y, "Learning_Rate": np.array([lr_at(step)], np.float32)}
        loss, _pred = session.run(["loss", "pred"], feeds)
        losses.append(float(loss))
    return losses, session.get_state(), str(session._directory)


def _main() -> None:
    request = json.loads(sys.stdin.read())
    out = Path(request["out"])
    directories = []
    for case in request["cases"]:
        losses, state, directory = legacy_program(case, request.get("tag", ""))
        np.savez(out / f"{case}.npz", losses=np.array(losses), **state)
        directories.append(directory)
    import onnxruntime

    from onnxblocks._core.ort import has_training_build

    print(
        json.dumps(
            {
                "python": list(sys.version_info[:3]),
                "onnxruntime": onnxruntime.__version__,
                "training_build": has_training_build(),
                "directories": directories,
            }
        )
    )


if __name__ == "__main__":
    _main()
