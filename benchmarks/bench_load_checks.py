"""What the artifact-set checks cost when a ``TrainingSession`` opens, against opening it.

Usage::

    python benchmarks/bench_load_checks.py            # prints one line per backend
    python benchmarks/bench_load_checks.py --repeat 20

:func:`onnxblocks.runtime.consistency.check_artifact_set` reads the structure of
each model of an artifact set (no weights) and compares every parameter with the
checkpoint and the models with each other. This script generates a 784-512-512-10
MLP (cross entropy, AdamW) as training-build and as portable artifacts, and
times the check alone and a whole ``TrainingSession(...)`` (which includes it),
medians on this machine's CPU.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxblocks
from onnxblocks import losses
from onnxblocks.artifacts import OptimType
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.runtime import TrainingSession
from onnxblocks.runtime.consistency import check_artifact_set
from onnxblocks.runtime.layout import ArtifactFiles

DIMS = (784, 512, 512, 10)


def mlp():
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(len(DIMS) - 1):
        weight = (rng.standard_normal((DIMS[i], DIMS[i + 1])) * 0.05).astype(np.float32)
        inits += [
            numpy_helper.from_array(weight, f"w{i}"),
            numpy_helper.from_array(np.zeros(DIMS[i + 1], np.float32), f"b{i}"),
        ]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"h{i}"]))
        prev = f"h{i}"
        if i < len(DIMS) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DIMS[0]])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", DIMS[-1]])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), [
        i.name for i in inits
    ]


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    model, params = mlp()
    with tempfile.TemporaryDirectory() as tmp:
        for portable in (False, True):
            directory = Path(tmp) / f"portable-{portable}"
            onnxblocks.generate_artifacts(
                model,
                requires_grad=params,
                loss=losses.CrossEntropyLoss(),
                optimizer=OptimType.AdamW,
                artifact_directory=directory,
                portable=portable,
            )
            check, session = measure(directory, portable, args.repeat)
            kind = "portable" if portable else "training build"
            share = check / session
            print(
                f"{kind:>14}: check_artifact_set {check:.2f} ms, TrainingSession(...) "
                f"{session:.1f} ms ({share:.1%})"
            )


def measure(directory: Path, portable: bool, repeat: int) -> tuple[float, float]:
    """Median ms of the check alone and of opening a session on ``directory``."""
    files = ArtifactFiles.find(directory)
    ck = load_checkpoint(files.checkpoint)
    specs = {n: (a.dtype, tuple(a.shape)) for n, a in (*ck.trainable.items(), *ck.frozen.items())}
    trainable = list(ck.trainable)
    check = median_ms(
        lambda: check_artifact_set(files, specs, trainable, files.checkpoint, portable), repeat
    )
    return check, median_ms(lambda: TrainingSession(directory), max(3, repeat // 2))


if __name__ == "__main__":
    main()
