"""Worker of the loss grid, run in the Python 3.13 environment with stock onnxruntime (JSON in, JSON out).

Reads ``{"cells": [...], "batches": [...]}`` on stdin and prints ``{"cells": {...}, "batches": {...}}``
as one JSON line (``tests/losses/test_loss_grid.py`` builds the tasks):

* a cell is ``{"id", "directory", "data"}``: the portable artifacts of one loss
  configuration and an ``.npz`` of the batch's inputs (``x0``, ``x1``... in call
  order). The answer holds the loss and the gradient of every trainable parameter
  after one ``train_step``, and the loss of one ``train_and_update`` (the fused
  step model) from a fresh session.
* a batch task is ``{"id", "directory", "data", "sizes"}``: for each size in turn,
  ``train_and_update``, ``eval_step``, then ``train_step`` + ``optimizer_step`` on the
  first ``size`` rows; the answer holds every output.

An error is reported per cell (``{"error": ...}``), never for the whole run.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np


def _inputs(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"x{i}"] for i in range(len(data.files))]


def _plain(array: np.ndarray) -> list | float:
    return np.asarray(array, dtype=np.float64).tolist()


def cell(task: dict) -> dict:
    from onnxblocks.runtime import TrainingSession

    inputs = _inputs(task["data"])
    session = TrainingSession(task["directory"])
    loss = session.train_step(*inputs)[0]
    out = {
        "loss": _plain(loss),
        "gradients": {k: _plain(v) for k, v in session.gradients().items()},
    }
    fused = TrainingSession(task["directory"])
    out["fused_loss"] = _plain(fused.train_and_update(*inputs)[0])
    out["backend"] = session.backend
    return out


def batches(task: dict) -> dict:
    from onnxblocks.runtime import TrainingSession

    inputs = _inputs(task["data"])
    session = TrainingSession(task["directory"])
    session.learning_rate = float(task["lr"])
    seen: dict = {"step": [], "eval": [], "train": []}
    start = 0
    for size in task["sizes"]:
        batch = [a[start : start + size] for a in inputs]
        start += size
        seen["step"].append([_plain(o) for o in session.train_and_update(*batch)])
        seen["eval"].append([_plain(o) for o in session.eval_step(*batch)])
        seen["train"].append([_plain(o) for o in session.train_step(*batch)])
        session.optimizer_step()
    seen["params"] = {k: _plain(v) for k, v in session.parameters().items()}
    return seen


def _guarded(run, task: dict) -> dict:
    try:
        return run(task)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}


def main() -> int:
    import onnxruntime

    payload = json.load(sys.stdin)
    answer = {
        "onnxruntime": onnxruntime.__version__,
        "python": list(sys.version_info[:2]),
        "cells": {t["id"]: _guarded(cell, t) for t in payload.get("cells", [])},
        "batches": {t["id"]: _guarded(batches, t) for t in payload.get("batches", [])},
    }
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
