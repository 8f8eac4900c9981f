"""Exporting the trained inference model: self-contained at any size, on both backends.

Each case fine-tunes part of a model (a frozen embedding table read through ``Gather``,
a trainable head), exports into another folder, deletes the artifacts folder and runs
the export in a plain ``onnxruntime.InferenceSession``: its outputs must be the eval
model's outputs at the trained weights.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.runtime import TrainingSession

DIM, CLASSES, BATCH = 256, 4, 8
MB = 1 << 20


def _embedding_model(directory: Path, vocab: int) -> Path:
    """``y = Gather(E, ids) @ W + b`` saved with ``E`` ([vocab, DIM] float32) in external data, written in chunks.

    One chunk of rows is drawn and each later chunk is it shifted by its own small offset, so every row
    differs from every other (a row read from the wrong offset shows) without drawing 2 GiB (9 s of CPU).
    """
    directory.mkdir(parents=True)
    data = directory / "model.onnx.data"
    rng = np.random.default_rng(0)
    chunk = rng.standard_normal((min(1 << 16, vocab), DIM), dtype=np.float32)
    with open(data, "wb") as f:
        for k, start in enumerate(range(0, vocab, 1 << 16)):
            rows = min(1 << 16, vocab - start)
            f.write((chunk[:rows] + np.float32(k / 1024)).tobytes())
    table = TensorProto(name="E", data_type=TensorProto.FLOAT, dims=[vocab, DIM])
    table.data_location = TensorProto.EXTERNAL
    for key, value in (("location", data.name), ("offset", "0"), ("length", str(vocab * DIM * 4))):
        entry = table.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["E", "ids"], ["h"], axis=0),
            helper.make_node("MatMul", ["h", "W"], ["hw"]),
            helper.make_node("Add", ["hw", "b"], ["y"]),
        ],
        "embedding_head",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])],
        [
            table,
            numpy_helper.from_array(
                (rng.standard_normal((DIM, CLASSES)) * 0.1).astype(np.float32), "W"
            ),
            numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = directory / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _linked_model(source: Path, directory: Path) -> Path:
    """``source``'s model and data files hard-linked into ``directory`` (copied across file systems): each
    test deletes its own model folder, and the shared one stays whole."""
    directory.mkdir(parents=True)
    for path in source.parent.iterdir():
        try:
            os.link(path, directory / path.name)
        except OSError:
            shutil.copyfile(path, directory / path.name)
    return directory / source.name


def _train_export_and_run(
    tmp_path: Path, vocab: int, backend: str, source: Path | None = None
) -> tuple[Path, np.ndarray, np.ndarray]:
    if source is None:
        model = _embedding_model(tmp_path / "model", vocab)
    else:
        model = _linked_model(source, tmp_path / "model")
    artifacts = tmp_path / "artifacts"
    generate_artifacts(
        os.fspath(model),
        requires_grad=["W", "b"],
        frozen_params=["E"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=artifacts,
        additional_output_names=["y"],
        portable=backend == "portable",
    )
    shutil.rmtree(model.parent)  # the export may not read the source model either
    rng = np.random.default_rng(1)
    ids = rng.integers(0, vocab, size=BATCH, dtype=np.int64)
    ids[0], ids[1] = 0, vocab - 1  # the table's first and last rows
    target = rng.standard_normal((BATCH, CLASSES)).astype(np.float32)
    session = TrainingSession(artifacts, backend=backend)
    initial = session.eval_step(ids, target)[1]
    for _ in range(3):
        session.train_step(ids, target)
        session.optimizer_step()
        session.lazy_reset_grad()
    expected = session.eval_step(ids, target)[1]
    assert np.abs(expected - initial).max() > 1e-3, "training did not move the head"
    exported = session.export_inference_model(
        tmp_path / "export" / "classifier.onnx", output_names=["y"]
    )
    del session
    shutil.rmtree(artifacts)
    ort = pytest.importorskip("onnxruntime")
    inference = ort.InferenceSession(os.fspath(exported), providers=["CPUExecutionProvider"])
    (got,) = inference.run(["y"], {"ids": ids})
    return exported, got, expected


@pytest.mark.parametrize("backend", ["training", "portable"])
@pytest.mark.parametrize("size_mb", [1, 100])
def test_export_after_partial_fine_tuning(tmp_path, backend, size_mb):
    exported, got, expected = _train_export_and_run(tmp_path, size_mb * MB // (DIM * 4), backend)
    assert_close(
        got, expected, rtol=1e-5, name="the export's y"
    )  # ours against ours: rtol and the floor
    # under 1 GiB of weights the export is one file
    assert sorted(p.name for p in exported.parent.iterdir()) == ["classifier.onnx"]
    assert not any(
        t.data_location == TensorProto.EXTERNAL
        for t in onnx.load(os.fspath(exported)).graph.initializer
    )


#: rows of the table of the over-2-GiB cases: 2 GiB + 4 MiB of frozen float32
VOCAB_OVER_2GB = (2 * 1024 * MB) // (DIM * 4) + 4096


@pytest.fixture(scope="module")
def model_over_2gb(tmp_path_factory):
    """The over-2-GiB source model, written once for both backends (drawing its table is most of a case's
    time); removed when the module is done."""
    directory = tmp_path_factory.mktemp("over-2gb") / "model"
    path = _embedding_model(directory, VOCAB_OVER_2GB)
    yield path
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("backend", ["training", "portable"])
def test_export_over_2gb(tmp_path, backend, model_over_2gb):
    vocab = VOCAB_OVER_2GB
    exported, got, expected = _train_export_and_run(tmp_path, vocab, backend, model_over_2gb)
    assert_close(got, expected, rtol=1e-5, name="the export's y")
    assert sorted(p.name for p in exported.parent.iterdir()) == [
        "classifier.onnx",
        "classifier.onnx.data",
    ]
    model = onnx.load(os.fspath(exported), load_external_data=False)
    locations = {
        e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"
    }
    assert locations == {"classifier.onnx.data"}
    assert os.path.getsize(exported.parent / "classifier.onnx.data") >= vocab * DIM * 4


@pytest.mark.parametrize("backend", ["training", "portable"])
def test_export_replaces_an_earlier_export_without_leaving_its_data(tmp_path, backend):
    """A small export over a large one's name removes the data file the new model no longer reads."""
    destination = tmp_path / "export" / "classifier.onnx"
    destination.parent.mkdir()
    (destination.parent / "classifier.onnx.data").write_bytes(b"stale")
    exported, got, expected = _train_export_and_run(tmp_path, 64, backend)
    assert exported == destination
    assert_close(got, expected, rtol=1e-5, name="the export's y")
    assert sorted(p.name for p in destination.parent.iterdir()) == ["classifier.onnx"]


def test_training_parameter_spec_reads_no_values(tmp_path):
    """The training backend's parameter spec comes from the element type, so it works without copying the tensor."""
    model = _embedding_model(tmp_path / "model", 64)
    generate_artifacts(
        os.fspath(model),
        requires_grad=["W"],
        frozen_params=["E", "b"],
        loss=LossType.MSELoss,
        optimizer=OptimType.SGD,
        artifact_directory=tmp_path / "artifacts",
    )
    session = TrainingSession(tmp_path / "artifacts", backend="training")
    assert session._backend.parameter_spec("E") == (np.dtype(np.float32), (64, DIM))
    assert session._backend.parameter_spec("b") == (np.dtype(np.float32), (CLASSES,))
