"""Running ``loss_grid_worker.py`` in the Python 3.13 environment with stock onnxruntime (JSON in, JSON out)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent


def run_grid_worker(python: Path, payload: dict, timeout: int = 900) -> dict:
    """Run the worker with ``payload`` on stdin in ``python`` and return its answer.

    Raises:
        AssertionError: when the worker fails or prints no answer, with its error output.
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.fspath(SUPPORT.parents[1]), os.fspath(SUPPORT.parent)]),
    }
    env.pop("PYTHONHOME", None)
    done = subprocess.run(
        [os.fspath(python), os.fspath(SUPPORT / "loss_grid_worker.py")],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, (
        f"the Python 3.13 worker failed (exit {done.returncode}):\n{done.stderr[-6000:]}"
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, (
        f"the Python 3.13 worker printed no answer:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    answer = json.loads(lines[-1])
    assert answer["python"] == [3, 13], answer["python"]
    return answer
