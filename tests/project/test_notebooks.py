"""The example notebooks: up to date with notebooks/_build.py, run without errors, export to HTML with pictures."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = [
    "01_quickstart",
    "02_exploring_training_graphs",
    "03_training_loop",
    "04_from_pytorch_and_onnxscript",
    "05_torch_module",
    "06_lora",
    "07_federated",
]
KERNEL = "onnxblocks-test-python"


def _load_builder():
    spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOKS / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    """A kernelspec that runs this interpreter, so notebooks see the same environment as the tests."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "onnxblocks tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return root


@pytest.fixture
def kernel_env(kernel_dir, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    from jupyter_client.kernelspec import KernelSpecManager

    assert KernelSpecManager().get_kernel_spec(KERNEL).argv[0] == sys.executable
    return KERNEL


def test_every_notebook_is_listed_and_matches_the_builder():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == NAMES
    builder = _load_builder()
    assert list(builder.NOTEBOOKS) == NAMES
    for name in NAMES:
        committed = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        fresh = builder.make(name)
        assert [(c.cell_type, c.source) for c in committed.cells] == [
            (c.cell_type, c.source) for c in fresh.cells
        ], f"{name}.ipynb is out of date: run `.venv/bin/python notebooks/_build.py {name[:2]}`"
        code_cells = [c for c in committed.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code_cells), (
            f"{name}.ipynb is committed without outputs"
        )
        assert not [o for c in code_cells for o in c.outputs if o.output_type == "error"]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes_without_errors(name, kernel_env):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name=kernel_env, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert not [o for o in outputs if o.output_type == "stream" and o.name == "stderr"], (
        "a cell wrote to stderr"
    )
    html = [o.data["text/html"] for o in outputs if "data" in o and "text/html" in o.data]
    if name == "03_training_loop":
        assert sum("image/png" in o.get("data", {}) for o in outputs) == 3  # data, curves, regions
    elif name == "07_federated":
        assert (
            sum("image/png" in o.get("data", {}) for o in outputs) == 3
        )  # clients' data, rounds, regions
    else:
        assert any("<svg" in h for h in html), "the rich display drew no picture"
    text = "".join(o.text for o in outputs if o.output_type == "stream")
    expected = {
        "01_quickstart": "ONNX Runtime:",
        "02_exploring_training_graphs": "fc1.weight_grad.accumulation.buffer",
        "03_training_loop": "optimizer steps",
        "04_from_pytorch_and_onnxscript": "after 20 steps",
        "05_torch_module": "gradients equal torch's",
        "06_lora": "merged: 4 6 8 | 10 12 14 0 2 4 6",
        "07_federated": "held-out accuracy",
    }[name]
    assert expected in text


def test_html_export_keeps_the_pictures():
    from nbconvert import HTMLExporter

    nb = nbformat.read(NOTEBOOKS / "02_exploring_training_graphs.ipynb", as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    assert body.count("<svg") >= 5
    assert "fc2.weight_grad.accumulation.buffer" in body and "InPlaceAccumulatorV2" in body
