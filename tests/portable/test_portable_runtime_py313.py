"""Portable artifacts on stock onnxruntime under Python 3.13, where onnxruntime-training has no wheel.

A cached 3.13 venv (``tests/support/portable_env.py``) gets the project's dependencies as
``pip install onnxblocks`` resolves them there (stock onnxruntime), and one worker
call (``tests/support/portable_worker.py``) does everything on that side; the numbers are
checked here against torch eager AdamW (in float32 and float64, ``support.numerics``) and the training build.
"""

from __future__ import annotations

import numpy as np
import torch
from support import portable_linear as pl
from support.adamw_oracle import torch_adamw
from support.numerics import assert_close, assert_equal, is_close
from support.portable_env import run_worker

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.runtime import TrainingSession

LR = 0.01


def test_portable_training_on_python_313_with_stock_onnxruntime(portable_python, tmp_path):
    fused, unfused = pl.write(tmp_path / "fused"), pl.write(tmp_path / "unfused", fused=False)
    batches = pl.batches(10)
    data = tmp_path / "batches.npz"
    np.savez(
        data, **{f"x{i}_{k}": a for i, batch in enumerate(batches) for k, a in enumerate(batch)}
    )
    training = tmp_path / "training"
    generate_artifacts(
        pl.forward_model(),
        requires_grad=["W", "b"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=training,
    )
    first = TrainingSession(training)  # 4 steps on the training build, then on to Python 3.13
    first.learning_rate = LR
    handed = [float(first.train_and_update(*b)[0]) for b in batches[:4]]
    first.save_checkpoint(tmp_path / "from_311")

    common = {"task": "train", "data": str(data), "steps": 10, "lr": LR}
    answer = run_worker(
        portable_python,
        {
            "tasks": [
                {"task": "environment", "training_artifacts": str(training)},
                {
                    **common,
                    "directory": str(fused),
                    "save": str(tmp_path / "from_313"),
                    "export": str(tmp_path / "m.onnx"),
                    "export_outputs": ["y"],
                    "params_out": str(tmp_path / "params.npz"),
                },
                {**common, "directory": str(fused), "resume_at": 5},
                {**common, "directory": str(unfused), "mode": "train_step"},
                {**common, "directory": str(unfused), "resume_at": 3},
                {
                    **common,
                    "directory": str(fused),
                    "checkpoint": str(tmp_path / "from_311"),
                    "steps": 6,
                    "start": 4,
                    "data": str(data),
                },
            ]
        },
    )
    results = answer["results"]
    for result in results:
        assert "error" not in result, result.get("trace")
    env, plain, resumed, unfused_run, unfused_resumed, continued = results

    assert env["python"][:2] == [3, 13] and env["training_build"] is False
    assert int(env["onnxruntime"].split(".")[1]) >= 20
    assert env["checkpoint_properties"] == {"k": 1} and env["html"] > 0 and env["loss_output"]
    name, message, is_import_error = env["generate_error"]
    assert name == "TrainingBuildRequiredError" and is_import_error
    assert (
        "onnxruntime-training" in message and "no Python 3.10-3.12 to run it was found" in message
    )
    assert "uv python install 3.12" in message and "$ONNXBLOCKS_TRAINING_PYTHON" in message
    assert (
        env["session_error"][0] == "TrainingBuildRequiredError"
        and "not portable" in env["session_error"][1]
    )

    expected_losses, expected_params = torch_adamw(batches, lr=LR)
    losses64, params64 = torch_adamw(batches, lr=LR, dtype=torch.float64)
    expected_losses = np.float32(expected_losses)
    for run in (plain, unfused_run):
        assert run["backend"] == "portable" and run["step"] == 10
        assert_close(np.float32(run["losses"]), expected_losses, losses64, rtol=1e-5, name="losses")
    assert resumed["losses"] == plain["losses"]  # save at step 5, reopen, go on: bit for bit
    assert unfused_resumed["losses"] == plain["losses"] or is_close(
        np.float32(unfused_resumed["losses"]), expected_losses, losses64, rtol=1e-5
    )
    assert unfused_resumed["losses"] == unfused_run["losses"]
    with np.load(tmp_path / "params.npz") as params:
        for name, value in expected_params.items():
            assert_close(params[name], value, params64[name], rtol=1e-5, name=name)
    assert_equal(
        np.float32(plain["exported"][0]), np.float32(plain["eval"][0]), name="exported against eval"
    )

    # the training build's checkpoint went on under 3.13 ...
    handed_on = np.float32(handed + continued["losses"][:6])
    assert_close(handed_on, expected_losses, losses64, rtol=1e-5, name="losses from 3.11 to 3.13")
    # ... and the 3.13 checkpoint goes on under the training build
    back = TrainingSession(training, checkpoint=tmp_path / "from_313")
    assert back.step == 10 and back.properties["from"] == "py313"
    assert_close(back.get_parameter("W"), expected_params["W"], params64["W"], rtol=1e-5, name="W")
