"""Batch sizes that change from one run to the next, on both backends (Python 3.11, onnxruntime-training 1.19.2).

An output whose shape follows the batch (extra outputs such as the logits, a
``"none"`` loss) must come back in each batch's shape from the fused step, the
unfused step (training + optimizer model) and the eval model. The training
build's artifacts are the oracle: the portable backend gives the same losses,
outputs and parameters, batch after batch, here and on stock onnxruntime in
the Python 3.13 worker (``support/loss_grid_worker.py``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from support.loss_grid import run_grid_worker
from support.numerics import assert_close
from support.runtime_support import classification_data, mlp_model

from onnxblocks import losses
from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.cli import EXIT_OK, main
from onnxblocks.runtime import TrainingSession

SIZES = (8, 5, 8, 3, 1)
#: the two backends are both float32 programs of ours: no float64 truth, the floor from each tensor's size
RTOL = 1e-5


def _generate(directory, reduction: str, portable: bool, fused: bool = True):
    generate_artifacts(
        mlp_model(),
        requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
        loss=losses.CrossEntropyLoss(reduction=reduction),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        additional_output_names=["logits"],
        portable=portable,
        fused_step=fused,
    )
    return directory


def _run(directory, backend: str) -> dict:
    """Each batch size in turn: a step, an eval step, then a train step and an optimizer step."""
    session = TrainingSession(directory, backend=backend)
    session.learning_rate = 0.05
    x, y = classification_data(sum(SIZES) * 2)
    seen: dict = {"step": [], "eval": [], "train": []}
    start = 0
    for size in SIZES:
        batch = (x[start : start + size], y[start : start + size])
        start += size
        seen["step"].append(session.train_and_update(*batch))
        seen["eval"].append(session.eval_step(*batch))
        seen["train"].append(session.train_step(*batch))
        session.optimizer_step()
    seen["params"] = session.parameters()
    return seen


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_outputs_follow_the_batch_size_on_both_backends(tmp_path, reduction):
    expected = _run(_generate(tmp_path / "training", reduction, portable=False), "training")
    for fused in (True, False):
        got = _run(
            _generate(tmp_path / f"portable-{fused}", reduction, portable=True, fused=fused),
            "portable",
        )
        for kind in ("step", "eval", "train"):
            for size, want, have in zip(SIZES, expected[kind], got[kind], strict=True):
                assert [o.shape for o in have] == [o.shape for o in want]
                assert have[1].shape == (size, 3)  # the logits, in this batch's shape
                for w, h in zip(want, have, strict=True):
                    assert_close(h, w, rtol=RTOL, name=f"{kind}, batch of {size}")
        for name, value in expected["params"].items():
            assert_close(got["params"][name], value, rtol=1e-4, name=name)


def test_cli_trains_a_last_short_batch_with_an_extra_output(tmp_path, capsys):
    """``--additional-output logits`` and 50 rows in batches of 16 (the last has 2): both backends, the same result."""
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    x, y = classification_data(50)
    np.savez(tmp_path / "train.npz", x=x, labels=y)
    saved = {}
    for portable in (False, True):
        out = tmp_path / f"art-{portable}"
        argv = [
            "artifacts",
            tmp_path / "mlp.onnx",
            "--loss",
            "crossentropy",
            "--requires-grad",
            "fc*",
        ]
        argv += ["--additional-output", "logits", "-o", out] + (["--portable"] if portable else [])
        assert main([str(a) for a in argv]) == EXIT_OK
        argv = [
            "train",
            out,
            "--data",
            tmp_path / "train.npz",
            "--batch-size",
            "16",
            "--epochs",
            "2",
        ]
        argv += [
            "--no-shuffle",
            "--val-fraction",
            "0.2",
            "--accuracy",
            "--no-progress",
            "--lr",
            "0.02",
        ]
        argv += ["--save", tmp_path / f"ckpt-{portable}"]
        code = main([str(a) for a in argv])
        printed = capsys.readouterr()
        assert code == EXIT_OK, printed.err
        assert "trained 6 steps" in printed.out and "accuracy" in printed.out, printed.out
        saved[portable] = load_checkpoint(tmp_path / f"ckpt-{portable}")
    for name, value in saved[False].trainable.items():
        assert_close(saved[True][name], value, rtol=1e-4, name=name)


def test_outputs_follow_the_batch_size_on_stock_onnxruntime(tmp_path, portable_python):
    expected = _run(_generate(tmp_path / "training", "sum", portable=False), "training")
    x, y = classification_data(sum(SIZES) * 2)
    np.savez(tmp_path / "data.npz", x0=x, x1=y)
    tasks = [
        {
            "id": str(fused),
            "directory": str(
                _generate(tmp_path / f"portable-{fused}", "sum", portable=True, fused=fused)
            ),
            "data": str(tmp_path / "data.npz"),
            "sizes": list(SIZES),
            "lr": 0.05,
        }
        for fused in (True, False)
    ]
    answer = run_grid_worker(portable_python, {"batches": tasks})
    for fused in ("True", "False"):
        got = answer["batches"][fused]
        assert "error" not in got, got.get("trace")
        for kind in ("step", "eval", "train"):
            for size, want, have in zip(SIZES, expected[kind], got[kind], strict=True):
                assert np.shape(have[1]) == (size, 3)
                for w, h in zip(want, have, strict=True):
                    assert_close(np.float32(h), w, rtol=1e-4, name=f"{kind}, batch of {size}")
        for name, value in expected["params"].items():
            assert_close(np.float32(got["params"][name]), value, rtol=1e-4, name=name)
