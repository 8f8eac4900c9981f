"""The JavaScript client in Node (onnxruntime-node) against Python, on portable artifacts.

For the demo's classifier and a small transformer: the same artifacts and the same
20 batches give the same losses in Node, in Python on this venv's onnxruntime
(the portable backend) and in Python 3.13 on stock onnxruntime, within 1e-5
relative per step; the parameters trained in Node load back into Python and give
the same eval loss and accuracy; the state Node saves resumes in Python.

Needs Node and the client's npm packages (installed into a cache on first use,
tests/support/web_support.py); fails, never skips, without them.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from support import web_support
from support.numerics import assert_close
from support.portable_env import run_worker

from onnxblocks import artifacts
from onnxblocks.runtime import TrainingSession
from onnxblocks.web import (
    load_state,
    read_safetensors,
    read_state,
    spiral_artifacts,
    spiral_plan,
    state_to_checkpoint,
)
from onnxblocks.web import write_safetensors as write_plan

#: JavaScript and Python are two float32 clients of ours: no float64 truth, rtol and the floor from the size
STEPS, LR, RTOL = 20, 0.01, 1e-5


@pytest.fixture(scope="module")
def js(tmp_path_factory):
    try:
        return web_support.workspace(tmp_path_factory.mktemp("client"))
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))


def _gpt_case():
    from support.models import case

    c = case("gpt", "onnxscript")
    rng = np.random.default_rng(3)
    batches = [
        (rng.integers(0, 11, (2, 5)).astype(np.int64), rng.integers(0, 11, 10).astype(np.int64))
        for _ in range(4)
    ]
    return c, batches


@pytest.fixture(scope="module", params=["spiral-mlp", "gpt"])
def model(request, tmp_path_factory):
    """``(artifact dir, training batches, eval batch)`` of portable artifacts."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "spiral-mlp":
        directory = spiral_artifacts(root / "artifacts")
        plan = spiral_plan(epochs=1)
        return (
            directory,
            [plan.batch(i) for i in range(STEPS)],
            (plan.val_features, plan.val_labels),
        )
    case, batches = _gpt_case()
    directory = root / "artifacts"
    artifacts.generate_artifacts(
        case.onnx_model,
        requires_grad=case.params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=directory,
        additional_output_names=["output"],
        portable=True,
    )
    from onnxblocks.web import write_state

    write_state(directory)
    return directory, batches, batches[0]


def _python(directory, batches, steps=STEPS, lr=LR):
    session = TrainingSession(directory)
    session.learning_rate = lr
    losses = [float(session.train_and_update(*batches[i % len(batches)])[0]) for i in range(steps)]
    return session, np.array(losses)


def _accuracy(logits, labels):
    return float(np.mean(np.asarray(logits).argmax(-1) == labels))


@pytest.fixture(scope="module")
def node_run(js, model, tmp_path_factory):
    directory, batches, (x_eval, y_eval) = model
    out = tmp_path_factory.mktemp("node")
    names = TrainingSession(directory).input_names
    tensors = {
        f"train/{i}/{n}": v
        for i, batch in enumerate(batches)
        for n, v in zip(names, batch, strict=True)
    }
    tensors |= {f"eval/0/{names[0]}": x_eval, f"eval/0/{names[1]}": y_eval}
    write_plan(out / "plan.safetensors", tensors)
    report = web_support.run_node(
        js,
        "bin/onnxblocks-train.mjs",
        str(directory),
        "--plan", str(out / "plan.safetensors"),
        "--steps", str(STEPS),
        "--lr", str(LR),
        "--save", str(out / "trained.safetensors"),
        "--eval-outputs", str(out / "eval.safetensors"),
    )  # fmt: skip
    eval_outputs, _ = read_safetensors(out / "eval.safetensors")
    return report, out / "trained.safetensors", eval_outputs


def test_node_losses_equal_python_step_by_step(model, node_run):
    directory, batches, _ = model
    report, _, _ = node_run
    assert report["onnxruntime"] == "1.30.0" and report["step"] == STEPS
    _, python = _python(directory, batches)
    node = np.array(report["losses"])
    assert node.shape == (STEPS,)
    assert_close(np.float32(node), np.float32(python), rtol=RTOL, name="Node against Python")
    assert node[-5:].mean() < node[:5].mean()  # it trains


def test_node_losses_equal_stock_onnxruntime_on_python_313(
    model, node_run, portable_python, tmp_path
):
    directory, batches, _ = model
    report, _, _ = node_run
    data = tmp_path / "batches.npz"
    np.savez(
        data, **{f"x{i}_{k}": v for i, batch in enumerate(batches) for k, v in enumerate(batch)}
    )
    copy = shutil.copytree(directory, tmp_path / "artifacts")
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
    assert result["backend"] == "portable"
    assert_close(
        np.float32(report["losses"]),
        np.float32(result["losses"]),
        rtol=RTOL,
        name="Node against 3.13",
    )


def test_parameters_trained_in_node_load_back_into_python(model, node_run):
    directory, batches, (x_eval, y_eval) = model
    report, trained, eval_outputs = node_run
    python, _ = _python(directory, batches)
    expected = python.eval_step(x_eval, y_eval)

    session = TrainingSession(directory)
    state = load_state(session, trained)
    assert state.step == STEPS and np.float32(state.learning_rate) == np.float32(
        LR
    )  # a float32 setting
    loaded = session.eval_step(x_eval, y_eval)
    assert_close(loaded[0], expected[0], rtol=RTOL, name="eval loss")
    assert_close(
        np.float32(report["evalLosses"][0]), expected[0], rtol=RTOL, name="Node's eval loss"
    )
    (js_logits,) = eval_outputs.values()
    assert (
        _accuracy(loaded[1], y_eval)
        == _accuracy(expected[1], y_eval)
        == _accuracy(js_logits, y_eval)
    )
    assert_close(js_logits, loaded[1], rtol=1e-5, name="Node's logits")


def test_node_state_resumes_in_python_with_its_optimizer_state(model, node_run, tmp_path):
    """Step 21 from the state Node saved equals step 21 of an uninterrupted Python run."""
    directory, batches, _ = model
    _, trained, _ = node_run
    _, uninterrupted = _python(directory, batches, steps=STEPS + 1)
    checkpoint = state_to_checkpoint(trained, tmp_path / "resumed")
    resumed = TrainingSession(directory, checkpoint=checkpoint)
    assert int(resumed.step) == STEPS
    assert np.float32(resumed.learning_rate) == np.float32(LR)  # ONNX Runtime keeps it in float32
    loss = float(resumed.train_and_update(*batches[STEPS % len(batches)])[0])
    assert_close(np.float32(loss), np.float32(uninterrupted[STEPS]), rtol=RTOL, name="step 21")
    moments = read_state(trained).moments
    assert moments and all(len(m) == 2 for m in moments.values())


def test_javascript_sources_type_check(js):
    """tsc checks the JSDoc types of the client, the CLI, the browser driver and the page (no emit)."""
    import subprocess

    done = subprocess.run(
        ["node", str(js / "node_modules" / "typescript" / "bin" / "tsc"), "-p", "jsconfig.json"],
        cwd=js,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_node_errors_say_what_to_do(js, tmp_path):
    from support import portable_linear

    from onnxblocks.web import write_state

    directory = portable_linear.write(tmp_path / "linear", fused=False)
    write_state(directory)
    x, t = portable_linear.batches(1)[0]
    write_plan(tmp_path / "plan.safetensors", {"train/0/x": x, "train/0/target": t})
    args = [
        "bin/onnxblocks-train.mjs",
        str(directory),
        "--plan",
        str(tmp_path / "plan.safetensors"),
        "--lr",
        "0.1",
    ]
    with pytest.raises(AssertionError, match=r"no step_model.onnx .*portable=True"):
        web_support.run_node(js, *args)
    portable_linear.write(directory, fused=True)
    (directory / "params.safetensors").unlink()
    with pytest.raises(AssertionError, match=r"no state file .*write_state"):
        web_support.run_node(js, *args)
    other = {"format": "onnxblocks-web/1", "trainable": '["V"]', "frozen": "[]"}
    write_plan(directory / "params.safetensors", {"V": np.zeros(3, np.float32)}, other)
    with pytest.raises(AssertionError, match=r"trainable parameter\(s\) V .*other artifacts"):
        web_support.run_node(js, *args)
    write_state(directory)
    assert len(web_support.run_node(js, *args)["losses"]) == 1
    write_plan(tmp_path / "plan.safetensors", {"train/0/x": x})
    with pytest.raises(
        AssertionError, match=r"missing input 'target'; the model's inputs are x, target"
    ):
        web_support.run_node(js, *args)
    with pytest.raises(AssertionError, match=r"--lr must be a finite number, got nan"):
        web_support.run_node(js, *args[:-1], "nan")
