"""Shared fixtures: small models and an ONNX Runtime runner."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list:
    """Run a model through onnxruntime's InferenceSession."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, feeds)


@pytest.fixture
def ort_run():
    """The ONNX Runtime runner: ``ort_run(model, feeds) -> list of outputs``."""
    return run_model


def make_linear_model(in_features: int = 8, out_features: int = 4, seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """``y = x @ W + b``: a one-layer model with float inputs ``x: [N, in]`` and output ``y: [N, out]``."""
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array(rng.standard_normal((in_features, out_features)).astype(np.float32), "W")
    b = onnx.numpy_helper.from_array(rng.standard_normal(out_features).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", in_features])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", out_features])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.fixture
def linear_model() -> onnx.ModelProto:
    """A fresh one-layer float model (``x`` -> ``y``)."""
    return make_linear_model()


@pytest.fixture(scope="session")
def portable_python():
    """The Python of a cached 3.13 venv with stock onnxruntime (see ``tests/portable_env.py``), built once.

    Fails, never skips, when CPython 3.13 or the packages cannot be had.
    """
    from portable_env import PortableEnvError, ensure_python313

    try:
        return ensure_python313()
    except PortableEnvError as exc:
        pytest.fail(str(exc))


#: Markers for files that need a real component; `slow` is set on tests themselves.
_FILE_MARKERS = {
    "test_js_node.py": "node",
    "test_web_browser.py": "browser",
    "test_portable_runtime_py313.py": "py313",
}


def pytest_collection_modifyitems(config, items):
    """Mark tests that need Node, Chromium or the Python 3.13 venv, so a fast subset can leave them out.

    ``pytest -m "not slow and not node and not browser and not py313"`` runs the fast subset;
    the README's command (no ``-m``) runs everything.
    """
    for item in items:
        marker = _FILE_MARKERS.get(item.path.name)
        if marker:
            item.add_marker(marker)
        if "portable_python" in getattr(item, "fixturenames", ()):
            item.add_marker("py313")
