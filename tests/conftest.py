"""Shared fixtures: small models and an ONNX Runtime runner (helpers live in ``support/``)."""

from __future__ import annotations

import onnx
import pytest
from support.onnx_models import make_linear_model, run_model
from support.ort_threads import install as install_ort_threads

#: ``training_dir`` (the optimizer oracle's training model), for the optimizer and checkpoint tests.
pytest_plugins = ["support.optim_oracle"]

install_ort_threads()  # ONNXBLOCKS_ORT_THREADS=N: every session the tests open gets N intra-op threads


@pytest.fixture
def ort_run():
    """The ONNX Runtime runner: ``ort_run(model, feeds) -> list of outputs``."""
    return run_model


@pytest.fixture
def linear_model() -> onnx.ModelProto:
    """A fresh one-layer float model (``x`` -> ``y``)."""
    return make_linear_model()


@pytest.fixture(scope="session")
def portable_python():
    """The Python of a cached 3.13 venv with stock onnxruntime (see ``tests/support/portable_env.py``), built once.

    Fails, never skips, when CPython 3.13 or the packages cannot be had.
    """
    from support.portable_env import PortableEnvError, ensure_python313

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
