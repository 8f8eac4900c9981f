"""The browser demo: the spiral classifier of ``onnxblocks demo`` as a static page that trains with
onnxruntime-web.

:func:`build_site` writes a folder that any static file server can serve (``serve``
here binds 127.0.0.1)::

    index.html                       a redirect to demo/
    demo/                            the page (js/demo: index.html, demo.mjs, plot.mjs)
    src/                             the JavaScript training client (js/src)
    ort/                             onnxruntime-web's WASM runtime (ort.wasm.min.mjs, .mjs + .wasm
    loader)
    artifacts/                       portable artifacts + params.safetensors (the checkpoint, for
    the web)
                                     + inference_model.onnx and .json (the model "Download model"
                                       fills)
    spirals.safetensors              the plan (:class:`SpiralPlan`): data, batch order, learning
    rates

(``demo/`` and ``src/`` sit side by side as in ``js/``, so the page's imports are the
repository's and type-check there.)

The page needs nothing else: no CDN, no network. The plan fixes the batches and
the learning rate of every step to those of the Python demo (same data, same
``ArrayBatches`` order, same cosine schedule), so Python replays the browser's
run step for step (:meth:`SpiralPlan.batch`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxblocks._core.errors import InvalidIndexError, InvalidValueError
from onnxblocks.web.flat_step import write_flat_step
from onnxblocks.web.inference import write_inference_template
from onnxblocks.web.npm import (
    WASM_RUNTIME_FILES,
    WEBGPU_RUNTIME_FILES,
    js_dir,
    onnxruntime_web_dist,
)
from onnxblocks.web.safetensors import write_safetensors
from onnxblocks.web.state import write_state

# the Python demo's choices (onnxblocks/demo.py, run_demo)
POINTS_PER_CLASS, CLASSES, VAL_FRACTION, BATCH_SIZE, PEAK_LEARNING_RATE = 400, 3, 0.2, 32, 0.01
L2, LABEL_SMOOTHING = 1e-4, 0.05
#: The plan file's name in the site.
PLAN_FILE = "spirals.safetensors"
#: The artifact folder's name in the site.
ARTIFACTS = "artifacts"
#: The page's path in the site.
PAGE = "demo/"


@dataclass(frozen=True)
class SpiralPlan:
    """The data and the schedule of the demo: what every training step feeds.

    Attributes:
        features: Training points ``[n, 2]`` (float32).
        labels: Their classes ``[n]`` (int64).
        val_features: Validation points (float32).
        val_labels: Validation classes (int64).
        order: Row order of each epoch ``[epochs, n]`` (int32), as ``ArrayBatches`` draws it.
        learning_rates: The learning rate of each step ``[steps]`` (float64), as ``CosineSchedule``
        gives it.
        batch_size: Rows per batch (the last batch of an epoch may be smaller).
        extent: Half the side of the square the page draws.
    """

    features: np.ndarray
    labels: np.ndarray
    val_features: np.ndarray
    val_labels: np.ndarray
    order: np.ndarray
    learning_rates: np.ndarray
    batch_size: int
    extent: float

    @property
    def batches_per_epoch(self) -> int:
        """Batches per epoch."""
        return -(-len(self.labels) // self.batch_size)

    @property
    def steps(self) -> int:
        """Training steps of the whole plan."""
        return len(self.learning_rates)

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(features, labels)`` of training step ``step`` (0-based), as the page builds it."""
        if not 0 <= step < self.steps:
            raise InvalidIndexError(f"step {step} is outside the plan's {self.steps} steps.")
        epoch, position = divmod(step, self.batches_per_epoch)
        rows = self.order[epoch, position * self.batch_size : (position + 1) * self.batch_size]
        return self.features[rows], self.labels[rows]

    def save(self, path: str | os.PathLike) -> Path:
        """Write the plan as the page reads it (safetensors)."""
        tensors = {
            "features": self.features,
            "labels": self.labels,
            "val_features": self.val_features,
            "val_labels": self.val_labels,
            "order": self.order,
            "learning_rates": self.learning_rates,
        }
        metadata = {
            "batch_size": str(self.batch_size),
            "classes": str(CLASSES),
            "extent": json.dumps(self.extent),
        }
        return write_safetensors(path, tensors, metadata)


def spiral_plan(epochs: int = 30, seed: int = 0) -> SpiralPlan:
    """The plan of ``onnxblocks demo --epochs epochs --seed seed``: its data, batch order and
    learning rates.
    """
    from onnxblocks.datasets import spirals, train_val_split
    from onnxblocks.runtime import ArrayBatches
    from onnxblocks.runtime.schedules.warmup import CosineSchedule

    if epochs < 1:
        raise InvalidValueError(f"epochs must be >= 1, got {epochs}.")
    x, y = spirals(points_per_class=POINTS_PER_CLASS, classes=CLASSES, seed=seed)
    (x_train, y_train), (x_val, y_val) = train_val_split(x, y, VAL_FRACTION)
    rows = ArrayBatches(
        (np.arange(len(x_train), dtype=np.int32),), batch_size=BATCH_SIZE, seed=seed
    )
    order = np.stack([np.concatenate([b for (b,) in rows]) for _ in range(epochs)])
    total = epochs * len(rows)
    schedule = CosineSchedule(
        PEAK_LEARNING_RATE, total_steps=total, warmup_steps=min(len(rows), total // 5)
    )  # as run_demo builds it
    rates = np.array([schedule(step) for step in range(total)], np.float64)
    extent = float(np.ceil(np.abs(x).max() * 10 + 1) / 10)
    return SpiralPlan(
        x_train, y_train, x_val, y_val, order.astype(np.int32), rates, BATCH_SIZE, extent
    )


def spiral_artifacts(directory: str | os.PathLike, seed: int = 0) -> Path:
    """Portable artifacts of the demo's classifier and loss (AdamW), with ``params.safetensors``
    beside them.

    The folder also gets ``inference_model.onnx`` and its layout
    (:func:`~onnxblocks.web.inference.write_inference_template`): the page's "Download model"
    fills it with the trained weights.
    """
    from onnxblocks import artifacts, optim
    from onnxblocks.demo import SmoothedCrossEntropyWithL2, build_classifier

    model = build_classifier(seed=seed)
    params = [i.name for i in model.graph.initializer]
    weights = [n for n in params if n.endswith(".weight")]
    target = Path(os.fspath(directory))
    artifacts.generate_artifacts(
        model,
        requires_grad=params,
        loss=SmoothedCrossEntropyWithL2(weights, l2=L2, label_smoothing=LABEL_SMOOTHING),
        optimizer=optim.AdamW(weight_decay=0.0),
        artifact_directory=target,
        additional_output_names=["logits"],
        portable=True,
    )
    write_state(target)
    write_flat_step(target)  # the client's WASM step: one state tensor each way (docs/web.md)
    write_inference_template(target, ["logits"])
    return target


def copy_client(site: Path, start: str, ort_web_dist: str | os.PathLike | None = None) -> None:
    """Copy the JS client's pages and modules and onnxruntime-web's WASM files into ``site``.

    Args:
        site: An existing directory.
        start: The page ``index.html`` redirects to (relative to ``site``).
        ort_web_dist: onnxruntime-web's ``dist`` directory; None takes the cached npm install's.
    """
    client = js_dir()
    dist = Path(os.fspath(ort_web_dist)) if ort_web_dist is not None else onnxruntime_web_dist()
    for sub, pattern in (("demo", "*"), ("src", "*.mjs")):
        (site / sub).mkdir(exist_ok=True)
        for path in sorted((client / sub).glob(pattern)):
            shutil.copyfile(path, site / sub / path.name)
    redirect = (
        '<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0; '
        f'url={start}">\n'
    )
    (site / "index.html").write_text(redirect, encoding="utf-8")
    (site / "ort").mkdir(exist_ok=True)
    for name in (*WASM_RUNTIME_FILES, *WEBGPU_RUNTIME_FILES):
        shutil.copyfile(dist / name, site / "ort" / name)


def build_site(
    directory: str | os.PathLike,
    epochs: int = 30,
    seed: int = 0,
    ort_web_dist: str | os.PathLike | None = None,
) -> Path:
    """Write the browser demo into ``directory`` (created; files it writes are replaced).

    Args:
        directory: The site folder.
        epochs: Epochs the page trains.
        seed: Seed of the data, the initial weights and the batch order.
        ort_web_dist: onnxruntime-web's ``dist/`` folder; default
            :func:`~onnxblocks.web.npm.onnxruntime_web_dist` (npm-installed into the cache once).

    Returns:
        The site folder; serve it with :func:`~onnxblocks.web.server.serve`.

    Raises:
        onnxblocks.web.npm.NpmError: when the client or onnxruntime-web cannot be had.
    """
    site = Path(os.fspath(directory))
    site.mkdir(parents=True, exist_ok=True)
    copy_client(site, "demo/", ort_web_dist)
    spiral_artifacts(site / ARTIFACTS, seed=seed)
    spiral_plan(epochs, seed).save(site / PLAN_FILE)
    return site
