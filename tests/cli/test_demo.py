"""``onnxblocks demo``: it reaches its stated accuracy, writes every file, and its custom loss is what it says."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from support.numerics import assert_close

from onnxblocks.datasets import spirals, train_val_split
from onnxblocks.demo import TARGET_ACCURACY, build_classifier, run_demo
from onnxblocks.runtime import TrainingSession


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = io.StringIO()
    result = run_demo(
        tmp_path_factory.mktemp("demo"), progress=False, stream=out, plot_backend="builtin"
    )
    return result, out.getvalue()


def test_demo_reaches_the_stated_accuracy(demo):
    result, _ = demo
    assert TARGET_ACCURACY == 0.9
    assert result.eval_accuracy >= TARGET_ACCURACY
    assert result.inference_accuracy == result.eval_accuracy
    assert result.passed
    assert result.history.metric("loss")[-1] < result.history.metric("loss")[0]


def test_exported_model_runs_in_inference_session(demo):
    import onnxruntime as ort

    result, _ = demo
    with np.load(result.files["validation_dataset"]) as data:
        x, y = data["features"], data["labels"]
    model = onnx.load(result.files["inference_model"])
    assert [i.name for i in model.graph.input] == ["features"]
    assert [o.name for o in model.graph.output] == ["logits"]
    session = ort.InferenceSession(
        str(result.files["inference_model"]), providers=["CPUExecutionProvider"]
    )
    (logits,) = session.run(None, {"features": x})
    assert np.mean(logits.argmax(1) == y) == result.eval_accuracy


def test_demo_writes_and_reports_every_file(demo):
    result, report = demo
    for role, path in result.files.items():
        assert path.exists(), role
        assert str(path) in report, role
    assert sorted(p.name for p in result.files["artifacts"].iterdir()) == [
        "checkpoint",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "training_model.onnx",
    ]
    png = result.files["loss_curve"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    for step in range(1, 8):
        assert f"[{step}/7]" in report
    assert "onnxblocks train" in report  # how to continue from the command line


def test_custom_loss_is_smoothed_cross_entropy_plus_l2(demo):
    """The loss composed from blocks equals the formula, computed in numpy on the initial weights."""
    result, _ = demo
    session = TrainingSession(
        result.files["artifacts"]
    )  # fresh: the generated checkpoint's initial weights
    params = session.parameters()
    x, y = spirals(points_per_class=20, seed=1)
    loss, logits = session.eval_step(x, y)
    (z, want), (z64, want64) = (_formula(params, x, y, dtype) for dtype in (np.float32, np.float64))
    # the logits sum products of the layers: the floor from the same sums of magnitudes
    magnitudes = {n: np.abs(v.astype(np.float64)) for n, v in params.items()}
    terms, _ = _formula(magnitudes, np.abs(x.astype(np.float64)), y, np.float64)
    assert_close(logits, z, z64, rtol=1e-5, scale=terms, name="logits")
    assert_close(loss, want, want64, rtol=1e-5, name="loss")


def _formula(
    params: dict, x: np.ndarray, y: np.ndarray, dtype: type
) -> tuple[np.ndarray, np.ndarray]:
    """The demo's logits and smoothed cross entropy plus L2, in NumPy in ``dtype``."""
    p = {n: v.astype(dtype) for n, v in params.items()}
    h = np.maximum(x.astype(dtype) @ p["fc1.weight"] + p["fc1.bias"], 0)
    h = np.maximum(h @ p["fc2.weight"] + p["fc2.bias"], 0)
    z = h @ p["fc3.weight"] + p["fc3.bias"]
    log_p = z - z.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    eps, classes = dtype(0.05), 3
    cross_entropy = -np.mean((1 - eps) * log_p[np.arange(len(y)), y] + eps / classes * log_p.sum(1))
    l2 = dtype(1e-4) * sum((p[f"fc{i}.weight"] ** 2).sum() for i in (1, 2, 3))
    return z, np.asarray(cross_entropy + l2, dtype)


def test_spirals_are_deterministic_and_balanced():
    x, y = spirals(points_per_class=50, classes=3, seed=4)
    x2, y2 = spirals(points_per_class=50, classes=3, seed=4)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (150, 2)
    assert np.bincount(y).tolist() == [50, 50, 50]
    assert not np.array_equal(x, spirals(points_per_class=50, classes=3, seed=5)[0])
    (a, _), (b, _) = train_val_split(x, y, 0.2)
    assert len(a) == 120 and len(b) == 30
    with pytest.raises(ValueError, match="classes >= 2"):
        spirals(classes=1)


def test_classifier_is_valid_and_loadable():
    model = build_classifier(hidden=(8,), classes=4, seed=0)
    onnx.checker.check_model(model)
    assert model.ir_version <= 10
    assert [i.name for i in model.graph.initializer] == [
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    assert model.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 4
