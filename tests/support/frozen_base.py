"""The frozen-base model of tests/peft/test_base_storage*.py: ``y = relu(x @ W1) @ W2``, only the head ``W2`` trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxblocks
from onnxblocks import LossType, OptimType, generate_artifacts
from onnxblocks.runtime import TrainingSession

D, OUT, N = 128, 4, 8
BACKENDS = [(False, "training"), (True, "portable")]


def weights(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((D, D)) * 0.1).astype(np.float32), (
        rng.standard_normal((D, OUT)) * 0.1
    ).astype(np.float32)


def make_model(inline_base: bool = False) -> onnx.ModelProto:
    """The model; with ``inline_base`` the base weight is a ``Constant`` node (never stored apart)."""
    w1, w2 = weights()
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="base"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["y"], name="head"),
    ]
    inits = [numpy_helper.from_array(w2, "W2")]
    if inline_base:
        nodes.insert(
            0,
            helper.make_node("Constant", [], ["W1"], value=numpy_helper.from_array(w1, "W1_value")),
        )
    else:
        inits.insert(0, numpy_helper.from_array(w1, "W1"))
    graph = helper.make_graph(
        nodes,
        "frozen_base",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", OUT])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def exported(tmp_path: Path) -> Path:
    """The model saved with its weights in ``m.onnx.data``, as exporters save large models."""
    folder = tmp_path / "src"
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save(
        make_model(), path, save_as_external_data=True, location="m.onnx.data", size_threshold=0
    )
    return path


def generate(model, directory: Path, portable: bool, **kwargs) -> onnxblocks.Artifacts:
    return generate_artifacts(
        model,
        requires_grad=["W2"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        portable=portable,
        **kwargs,
    )


def batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((N, D)).astype(np.float32), rng.standard_normal((N, OUT)).astype(
        np.float32
    )


def references(model_path: Path) -> dict[str, tuple[str, int, int]]:
    """Name -> (location, offset, length) of each external initializer of a model file."""
    model = onnx.load(model_path, load_external_data=False)
    out = {}
    for init in model.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in init.external_data}
            out[init.name] = (info["location"], int(info["offset"]), int(info["length"]))
    return out


def losses(directory: Path, backend: str, steps: int = 3) -> list[float]:
    session = TrainingSession(directory, backend=backend)
    x, y = batch()
    return [float(session.train_and_update(x, y)[0]) for _ in range(steps)]


def numpy_loss(dtype=np.float32, base_dtype=None) -> np.floating:
    """The first loss in NumPy's ``dtype`` (float64: the reference of ``support.numerics``), with the base
    weight rounded to ``base_dtype`` and back when given (what a cast base computes)."""
    (w1, w2), (x, y) = weights(), batch()
    if base_dtype is not None:
        w1 = w1.astype(base_dtype).astype(np.float32)
    w1, w2, x, y = (a.astype(dtype) for a in (w1, w2, x, y))
    pred = np.maximum(x @ w1, 0) @ w2
    return np.mean((pred - y) ** 2)
