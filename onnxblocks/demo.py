"""``onnxblocks demo``: the whole workflow on a small classifier, without torch and without
downloads.

:func:`run_demo` does, in order:

1. generates a 3-class spiral dataset in code (:func:`onnxblocks.datasets.spirals`);
2. builds a 2-64-64-3 MLP classifier with ``onnx.helper``;
3. composes a custom loss from blocks: cross entropy with label smoothing plus an
   L2 penalty on the weight matrices, written with Value arithmetic
   (:class:`SmoothedCrossEntropyWithL2`);
4. generates the training artifacts (AdamW);
5. trains with :func:`onnxblocks.runtime.fit` (cosine schedule, progress bar) and
   checks the validation accuracy reaches :data:`TARGET_ACCURACY`;
6. saves the loss curve (``loss_curve.png`` with matplotlib, else ``loss_curve.svg``);
7. exports the trained inference model and checks, with
   ``onnxruntime.InferenceSession``, that it reaches the same accuracy;
8. reports where every file went.

It runs in a few seconds on two CPU cores.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import IO, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxblocks.blocks.block import Block
from onnxblocks.blocks.reductions import ReduceSum
from onnxblocks.blocks.value import Value, value
from onnxblocks.io import atomic_file

#: The validation accuracy the demo promises (and its test checks).
TARGET_ACCURACY = 0.9
#: Default directory of the demo's files.
DEFAULT_OUTPUT_DIR = "onnxblocks-demo"


class SmoothedCrossEntropyWithL2(Block):
    """``cross_entropy(logits, labels; label_smoothing) + l2 * sum(w ** 2 for w in weights)``.

    A loss composed from blocks: the library's ``CrossEntropyLoss`` and a sum of
    squares of the named weight matrices, combined with Value arithmetic.

    Args:
        weights: Names of the parameters to penalise.
        l2: Weight of the penalty.
        label_smoothing: Label smoothing of the cross entropy.
    """

    def __init__(self, weights: list[str], l2: float = 1e-4, label_smoothing: float = 0.05) -> None:
        super().__init__()
        from onnxblocks.losses import CrossEntropyLoss

        self.cross_entropy = CrossEntropyLoss(label_smoothing=label_smoothing)
        self.weights = list(weights)
        self.l2 = l2

    def build(self, logits: str) -> Value:
        """Return the loss of ``logits`` against a new ``labels`` input."""
        cross_entropy = self.cross_entropy(logits)
        squares = [ReduceSum(keepdims=False)(value(w) * value(w)) for w in self.weights]
        return cross_entropy + self.l2 * reduce(lambda a, b: a + b, squares)


def build_classifier(
    in_features: int = 2, hidden: tuple[int, ...] = (64, 64), classes: int = 3, seed: int = 0
) -> onnx.ModelProto:
    """An MLP ``features -> [Gemm, Relu] * len(hidden) -> Gemm -> logits`` built with
    ``onnx.helper``.

    Weights use He initialisation from ``numpy.random.default_rng(seed)``; biases start at 0.
    Parameters are named ``fc{i}.weight`` (``[in, out]``) and ``fc{i}.bias``.
    """
    rng = np.random.default_rng(seed)
    sizes = [in_features, *hidden, classes]
    nodes, inits = [], []
    current = "features"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes), start=1):
        weight = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        inits += [
            numpy_helper.from_array(weight, f"fc{i}.weight"),
            numpy_helper.from_array(np.zeros(fan_out, np.float32), f"fc{i}.bias"),
        ]
        last = i == len(sizes) - 1
        out = "logits" if last else f"fc{i}.out"
        nodes.append(
            helper.make_node(
                "Gemm", [current, f"fc{i}.weight", f"fc{i}.bias"], [out], name=f"fc{i}"
            )
        )
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}.out"], name=f"relu{i}"))
            current = f"relu{i}.out"
    graph = helper.make_graph(
        nodes,
        "spiral_classifier",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", in_features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxblocks-demo"
    )
    from onnxblocks._core.limits import stamp_versions

    return stamp_versions(model)


@dataclass
class DemoResult:
    """What :func:`run_demo` produced.

    Attributes:
        output_dir: The directory holding everything below.
        files: Every file written, by role (``dataset``, ``base_model``, ``artifacts``,
            ``checkpoint``, ``loss_curve``, ``inference_model``).
        eval_accuracy: Validation accuracy from the eval model after training.
        inference_accuracy: Validation accuracy of the exported model run by
            ``onnxruntime.InferenceSession``.
        final_loss: Mean training loss of the last epoch.
        history: The :class:`~onnxblocks.runtime.fit.History` of training.
        seconds: Wall time of the whole demo.
    """

    output_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    eval_accuracy: float = float("nan")
    inference_accuracy: float = float("nan")
    final_loss: float = float("nan")
    history: object = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True when both accuracies reach :data:`TARGET_ACCURACY` and agree."""
        return (
            self.eval_accuracy >= TARGET_ACCURACY and self.inference_accuracy == self.eval_accuracy
        )


def run_demo(
    output_dir: str | os.PathLike = DEFAULT_OUTPUT_DIR,
    epochs: int = 30,
    seed: int = 0,
    progress: bool = True,
    stream: IO[str] | None = None,
    plot_backend: str = "auto",
    portable: bool = False,
) -> DemoResult:
    """Run the demo and return what it produced (see the module docstring for the steps).

    Args:
        output_dir: Where to write the files (created).
        epochs: Training epochs.
        seed: Seed of the dataset, the initial weights and the batch order.
        progress: Show the progress bar (on stderr).
        stream: Where to print the report (default ``sys.stdout``).
        plot_backend: ``"auto"``, ``"builtin"`` or ``"matplotlib"`` (see
            :func:`onnxblocks.runtime.save_line_plot`). The loss curve is
            ``loss_curve.png`` when matplotlib can be imported, else ``loss_curve.svg``.
        portable: Generate portable artifacts (standard ops, a fused step model) and
            train them on the portable backend, which runs on stock onnxruntime too.

    Returns:
        The :class:`DemoResult`; check ``result.passed``.
    """
    from onnxblocks import artifacts, optim
    from onnxblocks.datasets import spirals, train_val_split
    from onnxblocks.runtime import (
        Accuracy,
        ArrayBatches,
        TrainingSession,
        fit,
        plot_history,
    )
    from onnxblocks.runtime.plot import check_plot_path, default_suffix
    from onnxblocks.runtime.schedules.warmup import CosineSchedule

    out = stream if stream is not None else sys.stdout
    started = time.perf_counter()
    root = Path(output_dir)
    loss_curve = root / f"loss_curve{default_suffix()}"
    check_plot_path(
        loss_curve, plot_backend
    )  # an unknown backend or missing matplotlib fails now, not after training
    root.mkdir(parents=True, exist_ok=True)
    result = DemoResult(root)

    def say(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    say("onnxblocks demo: train a spiral classifier with ONNX Runtime (no torch, no downloads)")

    # 1. data
    x, y = spirals(points_per_class=400, classes=3, seed=seed)
    (x_train, y_train), (x_val, y_val) = train_val_split(x, y, 0.2)
    result.files["dataset"] = _save_npz(root / "spirals.npz", features=x_train, labels=y_train)
    result.files["validation_dataset"] = _save_npz(
        root / "spirals_val.npz", features=x_val, labels=y_val
    )
    say(
        f"[1/7] dataset: 3-class spirals, {len(x_train)} training and {len(x_val)} validation "
        "points"
    )

    # 2. model
    model = build_classifier(seed=seed)
    result.files["base_model"] = _save_model(model, root / "classifier.onnx")
    weights = [i.name for i in model.graph.initializer if i.name.endswith(".weight")]
    params = [i.name for i in model.graph.initializer]
    count = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    say(f"[2/7] model: MLP 2-64-64-3 built with onnx.helper ({count:,} parameters)")

    # 3-4. loss and artifacts
    loss = SmoothedCrossEntropyWithL2(weights, l2=1e-4, label_smoothing=0.05)
    say(
        "[3/7] loss: cross entropy (label smoothing 0.05) + 1e-4 * sum of squared weights, "
        "composed from blocks"
    )
    artifact_dir = root / "artifacts"
    portable_options: dict[str, Any] = {"portable": True} if portable else {}
    written = artifacts.generate_artifacts(
        model,
        requires_grad=params,
        loss=loss,
        optimizer=optim.AdamW(weight_decay=0.0),
        artifact_directory=artifact_dir,
        additional_output_names=["logits"],
        **portable_options,
    )
    result.files["artifacts"] = artifact_dir
    say(f"[4/7] training artifacts: {', '.join(p.name for p in written.files)}")

    # 5. training
    session = TrainingSession(
        artifact_dir
    )  # portable artifacts run on the portable backend (any onnxruntime)
    train = ArrayBatches((x_train, y_train), batch_size=32, seed=seed)
    val = ArrayBatches((x_val, y_val), batch_size=256, shuffle=False)
    total_steps = epochs * len(train)
    schedule = CosineSchedule(
        0.01, total_steps=total_steps, warmup_steps=min(len(train), total_steps // 5)
    )
    accuracy = Accuracy(output=1)
    say(
        f"[5/7] training: {epochs} epochs of {len(train)} batches, AdamW, cosine learning rate "
        "from 0.01 "
        f"({session.backend} backend)"
    )
    history = fit(
        session,
        train,
        epochs=epochs,
        eval_data=val,
        callbacks=[accuracy],
        scheduler=schedule,
        progress=progress,
    )
    result.history = history
    result.eval_accuracy = history.metric("accuracy")[-1]
    result.final_loss = history.metric("loss")[-1]
    result.files["checkpoint"] = session.save_checkpoint(
        root / "checkpoint", properties={"epochs": epochs}
    )
    verdict = "reached" if result.eval_accuracy >= TARGET_ACCURACY else "MISSED"
    say(
        f"      validation accuracy {result.eval_accuracy:.3f} ({verdict} the target "
        f"{TARGET_ACCURACY:.2f}), "
        f"final training loss {result.final_loss:.4f}, "
        f"{history.samples / max(history.seconds, 1e-9):,.0f} "
        "samples/s"
    )

    # 6. loss curve
    result.files["loss_curve"] = plot_history(
        history, loss_curve, title="Spiral classifier: loss", backend=plot_backend
    )
    say("[6/7] loss curve saved")

    # 7. inference model, checked with InferenceSession
    result.files["inference_model"] = session.export_inference_model(
        root / "spiral_classifier.onnx", ["logits"]
    )
    result.inference_accuracy = _inference_accuracy(result.files["inference_model"], x_val, y_val)
    agree = "same as" if result.inference_accuracy == result.eval_accuracy else "DIFFERENT FROM"
    say(
        "[7/7] exported inference model: onnxruntime.InferenceSession accuracy "
        f"{result.inference_accuracy:.3f} "
        f"({agree} the eval model)"
    )

    result.seconds = time.perf_counter() - started
    say(f"\nFiles (in {root}):")
    labels = {
        "dataset": "training data (features, labels)",
        "validation_dataset": "validation data",
        "base_model": "untrained classifier",
        "artifacts": "training artifacts",
        "checkpoint": "trained checkpoint (with optimizer state)",
        "loss_curve": "loss curve",
        "inference_model": "trained inference model",
    }
    for role, path in result.files.items():
        say(f"  {labels[role]:<42} {path}")
    say(
        f"\nDone in {result.seconds:.1f} s. Continue training from the command line with:\n"
        f"  onnxblocks train {artifact_dir} --data {result.files['dataset']} "
        f"--eval-data {result.files['validation_dataset']} --resume {result.files['checkpoint']} "
        "--epochs 5 --lr 0.001 "
        "--accuracy"
    )
    return result


def _inference_accuracy(model_path: Path, x: np.ndarray, y: np.ndarray) -> float:
    from onnxblocks._core.ort import onnxruntime, session_options

    ort = onnxruntime()

    inference = ort.InferenceSession(
        os.fspath(model_path), sess_options=session_options(), providers=["CPUExecutionProvider"]
    )
    (logits,) = inference.run(["logits"], {"features": x})
    return float(np.mean(logits.argmax(axis=1) == y))


def _save_npz(path: Path, **arrays: np.ndarray) -> Path:
    with (
        atomic_file(path) as temp,
        open(temp, "wb") as f,
    ):  # a file object: np.savez would append .npz to a name
        np.savez(f, **arrays)  # type: ignore[arg-type]  # stub: **kwds may fill allow_pickle: bool (older numpy lacks it)
    return path


def _save_model(model: onnx.ModelProto, path: Path) -> Path:
    with atomic_file(path) as temp:
        onnx.save(model, os.fspath(temp))
    return path
