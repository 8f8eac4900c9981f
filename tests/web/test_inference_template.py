"""The inference-model template: the page fills its parameter bytes with trained values and gets a valid ``.onnx``.

The filling is done here in Python exactly as ``js/src/inference.mjs`` does it (copy the
bytes at the layout's offsets); the Node test of the same function is in ``js/test/``, and
the browser test downloads the page's model (``tests/web/test_web_browser.py``).
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
from support.numerics import assert_close, is_close

from onnxblocks.runtime import TrainingSession
from onnxblocks.web import spiral_artifacts, spiral_plan, write_inference_template
from onnxblocks.web.inference import TEMPLATE_FORMAT


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return spiral_artifacts(tmp_path_factory.mktemp("spiral") / "artifacts")


def _fill(template: bytes, layout: dict, params: dict[str, np.ndarray]) -> bytes:
    out = bytearray(template)
    for entry in layout["tensors"]:
        raw = np.ascontiguousarray(params[entry["name"]], dtype="<f4").tobytes()
        assert len(raw) == entry["length"]
        out[entry["offset"] : entry["offset"] + entry["length"]] = raw
    return bytes(out)


def test_the_filled_template_runs_the_trained_parameters(artifacts):
    layout = json.loads((artifacts / "inference_model.onnx.json").read_text())
    assert layout["format"] == TEMPLATE_FORMAT and layout["outputs"] == ["logits"]
    template = (artifacts / "inference_model.onnx").read_bytes()
    session = TrainingSession(artifacts)
    assert sorted(t["name"] for t in layout["tensors"]) == sorted(session.parameter_names())
    plan = spiral_plan(epochs=1)
    for step in range(12):  # trained parameters, far from the template's initial ones
        session.learning_rate = float(plan.learning_rates[step])
        session.train_and_update(*plan.batch(step))
    params = {n: session.get_parameter(n) for n in session.parameter_names()}
    filled = _fill(template, layout, params)
    (logits,) = onnxruntime.InferenceSession(filled, providers=["CPUExecutionProvider"]).run(
        None, {layout["inputs"][0]: plan.val_features}
    )
    _, expected = session.eval_step(plan.val_features, plan.val_labels)
    assert_close(logits, expected, rtol=1e-5, name="logits")  # ONNX Runtime both: no float64 truth
    (initial,) = onnxruntime.InferenceSession(template, providers=["CPUExecutionProvider"]).run(
        None, {layout["inputs"][0]: plan.val_features}
    )
    assert not is_close(
        initial, logits, rtol=1e-5
    )  # the template holds the initial weights, not these


def test_a_second_template_writes_the_same_layout(artifacts, tmp_path):
    first = (artifacts / "inference_model.onnx.json").read_text()
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in artifacts.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    write_inference_template(copy, ["logits"])
    assert (copy / "inference_model.onnx.json").read_text() == first
    assert (copy / "inference_model.onnx").read_bytes() == (
        artifacts / "inference_model.onnx"
    ).read_bytes()
