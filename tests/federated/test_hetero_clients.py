"""Clients of two kinds in one federation on the deployment engine: Python 3.11 on ONNX Runtime's training
build with training artifacts, and Python 3.13 on stock onnxruntime with portable artifacts of the same model.

The 3.13 SuperNode (and so its SuperExec and ClientApp) runs in a cached venv with stock onnxruntime
and Flower (``tests/support/flower_env.py``), importing this checkout. The server checks names,
shapes and dtypes of both replies against the global parameters, and the one round's result is the
row-weighted average of the two backends' local training, computed here with one
:class:`~onnxblocks.runtime.TrainingSession` per artifact set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.federation import flower_processes
from support.flower_apps import assert_fedavg, client_files, session_steps, spiral_artifacts

from onnxblocks.cli import main
from onnxblocks.runtime import TrainingSession

ROOT = Path(__file__).resolve().parents[2]
STEPS, BATCH, LR = 2, 6, 0.1


@pytest.fixture(scope="module")
def flower_python313():
    """The cached 3.13 venv with stock onnxruntime and Flower, built once; fails (never skips) without 3.13."""
    from support.flower_env import ensure_python313_flower
    from support.portable_env import PortableEnvError

    try:
        return ensure_python313_flower()
    except PortableEnvError as exc:
        pytest.fail(str(exc))


def test_a_training_build_client_and_a_stock_onnxruntime_client_train_one_model(
    tmp_path, flower_python313, monkeypatch, capsys
):
    training = spiral_artifacts(tmp_path)
    portable = spiral_artifacts(tmp_path, portable=True)
    files = client_files(tmp_path, sizes=(20, 30))
    monkeypatch.setenv(
        "PYTHONPATH", str(ROOT)
    )  # the 3.13 venv imports onnxblocks from this checkout
    out = tmp_path / "out"
    argv = [
        "federate",
        str(training),
        "--client-data",
        files[0],
        "--client-data",
        files[1],
        "--client-artifacts",
        str(training),
        "--client-artifacts",
        str(portable),
        "--client-python",
        sys.executable,  # this interpreter (3.11, training build) ...
        "--client-python",
        str(flower_python313),  # ... and the 3.13 one
        "--rounds=1",
        f"--local-steps={STEPS}",
        f"--batch-size={BATCH}",
        f"--lr={LR}",
        "--no-shuffle",
        "--fraction-evaluate=0",
        f"--save={out / 'ckpt'}",
        f"--history={out / 'history.json'}",
        f"--run-dir={out / 'run'}",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    history = json.loads((out / "history.json").read_text())
    kinds = sorted(
        (c["partition"], c["backend"]) for c in history["clients"] if c["phase"] == "train"
    )
    assert kinds == [(0, "training"), (1, "portable")]
    assert history["dropped"] == []
    # the 3.13 node's commands ran under the 3.13 interpreter
    first_line = (out / "run" / "logs" / "supernode-1.log").read_text().splitlines()[0]
    assert "flower-supernode" in first_line
    shim = Path(first_line.split()[1]).read_text()
    assert str(flower_python313) in shim
    a, rows_a = session_steps(training, files[0], STEPS, LR, BATCH, backend="training")
    b, rows_b = session_steps(portable, files[1], STEPS, LR, BATCH, backend="portable")
    final = TrainingSession(training, checkpoint=out / "ckpt").parameters(trainable_only=True)
    assert_fedavg(final, [a, b], [rows_a, rows_b], rtol=1e-4)
    assert flower_processes(out / "run") == []
