"""The CNN with BatchNorm of ``bench_web.py --peers tfjs``, defined once for both trainers.

``features [batch, 1, 8, 8] -> Conv 3x3 (8 channels, pad 1) -> BatchNormalization (batch
statistics, training mode) -> Relu -> MaxPool 2x2 -> Flatten -> Gemm 128x3 -> logits``, cross
entropy, AdamW (weight decay 0, betas 0.9/0.999, eps 1e-8) at a constant rate. :func:`build_cnn`
writes it for onnxblocks (ONNX, NCHW); ``benchmarks/tfjs/train.mjs`` (``model: "cnn"``) writes
the same layers in TensorFlow.js (NHWC), from the weights :func:`tfjs_params` lays out for it.
The data: 8x8 images of noise with a bright 4x4 block in one of three places, the class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE, CHANNELS, CLASSES, BATCH, RATE, BN_EPS, SIGNAL = 8, 8, 3, 32, 0.003, 1e-5, 0.35
POOLED = SIZE // 2
#: one image in TensorFlow.js's NHWC: one channel, so the same numbers in the same order
TFJS_FEATURES = (SIZE, SIZE, 1)
#: where the bright block of each class sits (row, column of its corner)
CORNERS = ((0, 0), (0, 4), (4, 2))


class CnnPlan:
    """Batches and learning rates, read as ``onnxblocks.web.spiral_plan``'s are."""

    def __init__(self, steps: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, CLASSES, size=(steps, BATCH)).astype(np.int64)
        images = rng.normal(0.0, 1.0, size=(steps, BATCH, 1, SIZE, SIZE))
        for (step, row), label in np.ndenumerate(self.labels):
            r, c = CORNERS[label]
            images[step, row, 0, r : r + 4, c : c + 4] += SIGNAL
        self.features = images.astype(np.float32)
        self.learning_rates = np.full(steps, RATE)

    @property
    def steps(self) -> int:
        return len(self.labels)

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        return self.features[step], self.labels[step]


def build_cnn(seed: int = 0) -> onnx.ModelProto:
    """The CNN (He-initialised weights from ``seed``) as an ONNX model, batch statistics on."""
    rng = np.random.default_rng(seed)
    fan = CHANNELS * POOLED * POOLED
    params = {
        "conv.weight": rng.standard_normal((CHANNELS, 1, 3, 3)) * np.sqrt(2.0 / 9),
        "conv.bias": np.zeros(CHANNELS),
        "bn.scale": np.ones(CHANNELS),
        "bn.bias": np.zeros(CHANNELS),
        "bn.mean": np.zeros(CHANNELS),
        "bn.var": np.ones(CHANNELS),
        "fc.weight": rng.standard_normal((fan, CLASSES)) * np.sqrt(2.0 / fan),
        "fc.bias": np.zeros(CLASSES),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    nodes = [
        helper.make_node("Conv", ["features", "conv.weight", "conv.bias"], ["c"], pads=[1] * 4),
        helper.make_node(
            "BatchNormalization",
            ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
            ["n", "bn.mean.out", "bn.var.out"],
            epsilon=BN_EPS,
            training_mode=1,
        ),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 1, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        inits,
    )
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def write_artifacts(directory: Path) -> Path:
    """Portable onnxblocks artifacts of the CNN in ``directory`` (with ``params.safetensors``)."""
    from onnxblocks import artifacts, optim
    from onnxblocks.web.state import write_state

    trained = ["conv.weight", "conv.bias", "bn.scale", "bn.bias", "fc.weight", "fc.bias"]
    artifacts.generate_artifacts(
        build_cnn(),
        requires_grad=trained,
        frozen_params=["bn.mean", "bn.var"],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optim.AdamW(weight_decay=0.0),
        artifact_directory=directory,
        portable=True,
    )
    write_state(directory)
    return directory


def tfjs_params(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The trained parameters in TensorFlow.js's layout: NHWC kernels, flatten in (h, w, c)."""
    fc = params["fc.weight"].reshape(CHANNELS, POOLED, POOLED, CLASSES).transpose(1, 2, 0, 3)
    return {
        "conv.weight": params["conv.weight"].transpose(2, 3, 1, 0),
        "conv.bias": params["conv.bias"],
        "bn.scale": params["bn.scale"],
        "bn.bias": params["bn.bias"],
        "fc.weight": fc.reshape(-1, CLASSES),
        "fc.bias": params["fc.bias"],
    }
