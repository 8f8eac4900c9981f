"""What the gradient-builder worker costs: generate_artifacts in-process vs with ONNX Runtime's
calls in a worker.

Usage::

    python benchmarks/bench_gradient_worker.py                 # this Python (training build) both
    ways
    python benchmarks/bench_gradient_worker.py --repeat 5
    python3.13 benchmarks/bench_gradient_worker.py --worker-only   # on 3.13: the worker path alone

Both runs happen in this process, side by side, on the same models (random weights,
built with onnx.helper, no torch, no downloads): the worker run sets
``$ONNXBLOCKS_GRADIENT_BUILDER=worker`` with ``$ONNXBLOCKS_TRAINING_PYTHON`` = this
interpreter, so the difference is the worker's process start, the serialisation and
the pipe. Models: an MLP 64-256-256-10 (0.1 M parameters), a deeper MLP (12 layers of
1024, 12 M parameters: the skeleton sent to the worker holds no weight bytes), both
with cross entropy and AdamW. Columns: median wall seconds of ``generate_artifacts``
over ``--repeat`` runs (after one warm-up run each, which also starts the worker: one
worker process serves the calls of a Python process), the ratio worker / in-process,
and the largest request sent to the worker (the serialised skeleton, no weight bytes).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.gradient import worker, worker_process


def mlp(widths: list[int], seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        inits += [
            numpy_helper.from_array(
                (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"
            ),
            numpy_helper.from_array(np.zeros(b, np.float32), f"b{i}"),
        ]
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"h{i}"]))
        x = f"h{i}"
        if i < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"a{i}"]))
            x = f"a{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", widths[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", widths[-1]])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def timed(model: onnx.ModelProto, repeat: int) -> float:
    params = [i.name for i in model.graph.initializer]
    runs = []
    for _ in range(repeat + 1):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            generate_artifacts(
                model,
                requires_grad=params,
                loss=LossType.CrossEntropyLoss,
                optimizer=OptimType.AdamW,
                artifact_directory=tmp,
            )
            runs.append(time.perf_counter() - start)
    return statistics.median(runs[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--worker-only", action="store_true", help="time the worker path only (a Python 3.13+)"
    )
    args = parser.parse_args()
    cases = {"mlp-0.1M": mlp([64, 256, 256, 10]), "mlp-12M": mlp([1024] * 13 + [10])}
    print(
        f"Python {sys.version.split()[0]}, worker: "
        f"{sys.executable if not args.worker_only else 'found'}"
    )
    print(f"{'case':<10} {'in-process s':>13} {'worker s':>9} {'ratio':>6} {'skeleton bytes':>15}")
    for name, model in cases.items():
        in_process = None
        if not args.worker_only:
            os.environ["ONNXBLOCKS_GRADIENT_BUILDER"] = "in-process"
            in_process = timed(model, args.repeat)
            os.environ["ONNXBLOCKS_GRADIENT_BUILDER"] = "worker"
            os.environ["ONNXBLOCKS_TRAINING_PYTHON"] = sys.executable
            worker._worker_python.cache_clear()
        sent: list[int] = []
        original = worker_process.Channel.exchange

        def counting(self, header, blobs, timeout, _original=original, _sent=sent):
            _sent.append(sum(len(b) for b in blobs))
            return _original(self, header, blobs, timeout)

        worker_process.Channel.exchange = counting  # type: ignore[method-assign]
        in_worker = timed(model, args.repeat)
        worker_process.Channel.exchange = original  # type: ignore[method-assign]
        ratio = f"{in_worker / in_process:.2f}" if in_process else "-"
        shown = f"{in_process:.3f}" if in_process is not None else "-"
        print(f"{name:<10} {shown:>13} {in_worker:>9.3f} {ratio:>6} {max(sent):>15,}")
        os.environ.pop("ONNXBLOCKS_GRADIENT_BUILDER", None)


if __name__ == "__main__":
    main()
