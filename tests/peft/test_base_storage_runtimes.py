"""A shared frozen base (``base_weights.bin``) on the other runtimes: Node's onnxruntime-node, stock onnxruntime 3.13.

The artifacts of ``test_base_storage.py``'s model (a frozen 64 KiB base, a trainable
head), fp32 and fp16 bases: the JavaScript client in Node loads the models by path,
finds the base beside them, and trains step for step as Python does (1e-5 relative);
its state file holds the head and its moments only. Stock onnxruntime on Python
3.13 trains the same artifacts as this venv's portable backend.

Needs Node and the client's npm packages (tests/support/web_support.py), and the
Python 3.13 environment (tests/support/portable_env.py); fails, never skips, without them.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support import web_support
from support.frozen_base import batch, exported, generate
from support.numerics import assert_close
from support.portable_env import run_worker

from onnxblocks.runtime import TrainingSession
from onnxblocks.web import read_safetensors, write_state
from onnxblocks.web import write_safetensors as write_plan

STEPS, LR, RTOL = 5, 0.01, 1e-5


@pytest.fixture(scope="module")
def js(tmp_path_factory):
    try:
        return web_support.workspace(tmp_path_factory.mktemp("client"))
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module", params=[None, "float16"], ids=["fp32-base", "fp16-base"])
def shared(request, tmp_path_factory):
    """Portable artifacts with a shared base, and their state file."""
    root = tmp_path_factory.mktemp("shared")
    art = generate(exported(root), root / "art", True, base_dtype=request.param)
    assert art.base_weights is not None
    write_state(art.directory)
    return art.directory


def _python(directory):
    session = TrainingSession(directory, backend="portable")
    session.learning_rate = LR
    x, y = batch()
    return [float(session.train_and_update(x, y)[0]) for _ in range(STEPS)]


def test_node_trains_a_shared_base_as_python_does(js, shared, tmp_path):
    x, y = batch()
    write_plan(
        tmp_path / "plan.safetensors",
        {f"train/{i}/{n}": v for i in range(STEPS) for n, v in (("x", x), ("target", y))},
    )
    report = web_support.run_node(
        js,
        "bin/onnxblocks-train.mjs",
        str(shared),
        "--plan", str(tmp_path / "plan.safetensors"),
        "--steps", str(STEPS),
        "--lr", str(LR),
        "--save", str(tmp_path / "trained.safetensors"),
    )  # fmt: skip
    # two float32 implementations of ours (JavaScript, Python): no float64 truth
    assert_close(
        np.float32(report["losses"]),
        np.float32(_python(shared)),
        rtol=RTOL,
        name="Node against Python",
    )
    tensors, _ = read_safetensors(tmp_path / "trained.safetensors")
    assert set(tensors) == {
        "W2",
        "W2.exp_avg",
        "W2.exp_avg_sq",
    }  # the head and its moments, no base weight


def test_stock_onnxruntime_trains_a_shared_base_as_this_venv_does(
    shared, portable_python, tmp_path
):
    x, y = batch()
    data = tmp_path / "batches.npz"
    np.savez(data, x0_0=x, x0_1=y)
    copy = shutil.copytree(shared, tmp_path / "artifacts")
    (result,) = run_worker(
        portable_python,
        {
            "tasks": [
                {
                    "task": "train",
                    "directory": str(copy),
                    "data": str(data),
                    "steps": STEPS,
                    "lr": LR,
                }
            ]
        },
    )["results"]
    assert "error" not in result, result.get("trace")
    assert_close(
        np.float32(result["losses"]),
        np.float32(_python(shared)),
        rtol=RTOL,
        name="3.13 against 3.11",
    )
