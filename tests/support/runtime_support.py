"""Small models and training artifacts shared by the runtime, CLI and demo tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxblocks import artifacts, optim


def mlp_model(d_in: int = 2, hidden: int = 16, classes: int = 3, seed: int = 0) -> onnx.ModelProto:
    """``logits = relu(x @ fc1.weight + fc1.bias) @ fc2.weight + fc2.bias``; input ``x: [batch, d_in]``."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(
            (rng.standard_normal((d_in, hidden)) * 0.5).astype(np.float32), "fc1.weight"
        ),
        numpy_helper.from_array((rng.standard_normal(hidden) * 0.1).astype(np.float32), "fc1.bias"),
        numpy_helper.from_array(
            (rng.standard_normal((hidden, classes)) * 0.5).astype(np.float32), "fc2.weight"
        ),
        numpy_helper.from_array(
            (rng.standard_normal(classes) * 0.1).astype(np.float32), "fc2.bias"
        ),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Gemm", ["hr", "fc2.weight", "fc2.bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d_in])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def generate(
    directory: str | os.PathLike,
    model: onnx.ModelProto | None = None,
    loss: str | object = "crossentropy",
    optimizer: str | None = "adamw",
    requires_grad: list[str] | None = None,
    frozen: list[str] | None = None,
    additional_output_names: list[str] | None = ("logits",),  # type: ignore[assignment]
) -> Path:
    """Generate training artifacts with onnxblocks.artifacts.generate_artifacts."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else mlp_model()
    if isinstance(loss, str):
        loss = {
            "crossentropy": artifacts.LossType.CrossEntropyLoss,
            "mse": artifacts.LossType.MSELoss,
        }[loss]
    artifacts.generate_artifacts(
        model,
        requires_grad=requires_grad if requires_grad is not None else PARAMS,
        frozen_params=frozen,
        loss=loss,
        optimizer={"adamw": optim.AdamW, "sgd": optim.SGD}[optimizer]() if optimizer else None,
        artifact_directory=directory,
        additional_output_names=list(additional_output_names) if additional_output_names else None,
    )
    return directory


def classification_data(
    rows: int = 64, d_in: int = 2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Features and int64 labels of a 3-class problem (by quadrant)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d_in)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)).astype(np.int64)
    return x, y


def listing(directory: Path) -> list[str]:
    """Every entry below ``directory`` (hidden ones too), relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def tensors(values: dict[str, np.ndarray]) -> list[TensorProto]:
    return [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in values.items()]
