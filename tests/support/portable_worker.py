"""Worker run by the portable-runtime tests in the Python 3.13 environment with stock onnxruntime.

Reads ``{"tasks": [...], "processes": N}`` as JSON on stdin and prints ``{"results": [...]}``
as one JSON line. Each task is a dict with a ``"task"`` key:

* ``environment``: versions, the training-build probe, the DSL/losses/display/
  checkpoint tools on this Python, and the one clear error of
  ``generate_artifacts`` without a Python 3.10-3.12 for its gradient builder (and of
  non-portable artifacts, given ``"training_artifacts"``).
* ``train``: train ``"directory"`` on the batches of ``"data"`` (an ``.npz`` with
  ``x{i}_{k}``: input k of batch i) for ``"steps"`` steps with ``"mode"`` ``"step"``
  (``session.step``) or ``"train_step"`` (train_step + optimizer_step), learning
  rate ``"lr"``; optionally ``"resume_at"`` (save a checkpoint there, reopen a
  session from it and go on), ``"save"`` (checkpoint path at the end),
  ``"checkpoint"`` (start from it), ``"start"`` (index of the first batch), ``"params_out"`` (an ``.npz`` of the final
  parameters), ``"export"`` (an inference model path, run on the first batch).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np


def _batches(path: str) -> list[tuple[np.ndarray, ...]]:
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    count = 1 + max(int(k[1:].split("_")[0]) for k in arrays)
    out = []
    for i in range(count):
        keys = sorted(
            (k for k in arrays if k.startswith(f"x{i}_")), key=lambda k: int(k.split("_")[1])
        )
        out.append(tuple(arrays[k] for k in keys))
    return out


def environment(task: dict) -> dict:
    import onnx
    import onnxruntime

    import onnxblocks
    from onnxblocks import losses
    from onnxblocks._core.ort import has_training_build
    from onnxblocks.checkpoint import load_checkpoint, save_checkpoint
    from onnxblocks.errors import TrainingBuildRequiredError

    result: dict = {
        "python": list(sys.version_info[:3]),
        "onnxruntime": onnxruntime.__version__,
        "training_build": has_training_build(),
    }
    # the DSL, a loss and the display build and render without the training build
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])
    w = onnx.numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])],
            "g",
            [x],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 2])],
            [w],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )
    with onnxblocks.base(model) as accessor:
        loss = losses.MSELoss()("y")
    result["loss_output"] = str(loss)
    from onnxblocks import display

    result["html"] = len(display.repr_html(accessor.working_model) or "")
    with tempfile.TemporaryDirectory() as tmp:
        path = save_checkpoint(
            ({"w": np.ones((3, 2), np.float32)}, {}), Path(tmp) / "ck", properties={"k": 1}
        )
        result["checkpoint_properties"] = load_checkpoint(path).properties
        from onnxblocks.artifacts import LossType, generate_artifacts

        # with no Python 3.10-3.12 to run the gradient builder in (tests/artifacts/test_generate_any_python.py
        # generates with one), the error says what to install
        saved = {k: os.environ.get(k) for k in ("PATH", "PYENV_ROOT", "ONNXBLOCKS_TRAINING_PYTHON")}
        os.environ.update(PATH=tmp, PYENV_ROOT=tmp)
        os.environ.pop("ONNXBLOCKS_TRAINING_PYTHON", None)
        try:
            generate_artifacts(
                model, requires_grad=["w"], loss=LossType.MSELoss, artifact_directory=tmp + "/a"
            )
            result["generate_error"] = None
        except TrainingBuildRequiredError as exc:
            result["generate_error"] = [type(exc).__name__, str(exc), isinstance(exc, ImportError)]
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    if task.get("training_artifacts"):
        from onnxblocks.runtime import TrainingSession

        try:
            TrainingSession(task["training_artifacts"])
            result["session_error"] = None
        except TrainingBuildRequiredError as exc:
            result["session_error"] = [type(exc).__name__, str(exc)]
    return result


def train(task: dict) -> dict:
    from onnxblocks.runtime import TrainingSession

    batches = _batches(task["data"])
    steps, mode = int(task["steps"]), task.get("mode", "step")
    options = None
    if task.get("threads"):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = int(task["threads"])
    session = TrainingSession(
        task["directory"], checkpoint=task.get("checkpoint"), session_options=options
    )
    if task.get("lr") is not None:
        session.learning_rate = float(task["lr"])
    losses: list[float] = []
    for i in range(steps):
        if task.get("resume_at") == i:
            path = Path(task["directory"]).parent / f"resume-{Path(task['directory']).name}"
            session.save_checkpoint(path, properties={"at": i})
            lr = session.learning_rate
            session = TrainingSession(task["directory"], checkpoint=path)
            session.learning_rate = (
                lr  # the training API keeps the initial rate in checkpoints, not the current one
            )
        batch = batches[(int(task.get("start", 0)) + i) % len(batches)]
        if mode == "step":
            out = session.train_and_update(*batch)
        else:
            out = session.train_step(*batch)
            session.optimizer_step()
        losses.append(float(np.asarray(out[0]).reshape(-1)[0]))
    result: dict = {"losses": losses, "backend": session.backend, "step": int(session.step)}
    if task.get("save"):
        session.save_checkpoint(task["save"], properties={"from": "py313"})
    if task.get("params_out"):
        np.savez(task["params_out"], **session.parameters())
    if task.get("export"):
        import onnxruntime

        path = session.export_inference_model(task["export"], task.get("export_outputs"))
        from onnxblocks._core.ort import (
            session_options,
        )  # ONNXBLOCKS_ORT_THREADS sets the thread count

        inference = onnxruntime.InferenceSession(
            str(path), session_options(), providers=["CPUExecutionProvider"]
        )
        feeds = {
            i.name: batches[0][session.input_names.index(i.name)] for i in inference.get_inputs()
        }
        result["exported"] = [o.tolist() for o in inference.run(None, feeds)]
        result["eval"] = [o.tolist() for o in session.eval_step(*batches[0])[1:]]
    return result


def main() -> int:
    payload = json.load(sys.stdin)
    results = []
    for task in payload["tasks"]:
        try:
            results.append(
                {
                    "task": task["task"],
                    **{"environment": environment, "train": train}[task["task"]](task),
                }
            )
        except Exception as exc:
            results.append(
                {
                    "task": task["task"],
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(),
                }
            )
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
