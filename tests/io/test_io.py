"""save_model: held stubs and large initializers streamed to an external data file; ORT runs the result."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.onnx_models import run_model
from support.streaming import RecordingSource

import onnxblocks
from onnxblocks._core.weights import TensorSource, is_stub
from onnxblocks.io import atomic_outputs, load_model, save_model


def mlp(seed: int = 0) -> onnx.ModelProto:
    """``y = relu(x @ W1 + b1) @ W2 + b2`` with two large and two small initializers."""
    rng = np.random.default_rng(seed)
    inits = {
        "W1": rng.standard_normal((16, 64)).astype(np.float32),  # 4 KiB
        "b1": rng.standard_normal(64).astype(np.float32),  # 256 B
        "W2": rng.standard_normal((64, 8)).astype(np.float32),  # 2 KiB
        "b2": rng.standard_normal(8).astype(np.float32),  # 32 B
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h2"]),
            helper.make_node("MatMul", ["h2", "W2"], ["y0"]),
            helper.make_node("Add", ["y0", "b2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])  # IR 14 by default


def run_reference(model: onnx.ModelProto) -> np.ndarray:
    """The model's output on X, run from memory (with an IR version the runtime loads)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = 8
    return run_model(copy, {"x": X})[0]


X = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)


def run_file(path: Path, feeds: dict) -> list:
    import onnxruntime as ort

    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def build_scaled(model: onnx.ModelProto, model_path=None):
    """A build on ``model`` that adds ``z = 2 * y``; returns the accessor (its working model has stubs)."""
    with onnxblocks.base(model, model_path=model_path) as acc:
        z = acc.op("Mul", ["y", acc.constant(2.0)])
        acc.set_outputs([z])
    return acc


def initializers(path: Path) -> dict[str, TensorProto]:
    return {i.name: i for i in onnx.load(path, load_external_data=False).graph.initializer}


def test_round_trip_of_held_weights(tmp_path):
    model = mlp()
    before = model.SerializeToString()
    expected = run_reference(model)
    acc = build_scaled(model)
    assert any(is_stub(i) for i in acc.working_model.graph.initializer)
    written = save_model(acc.working_model, tmp_path / "model.onnx", acc.weights)
    assert written == tmp_path / "model.onnx.data"
    (got,) = run_file(tmp_path / "model.onnx", {"x": X})
    np.testing.assert_array_equal(got, 2 * expected)
    saved = initializers(tmp_path / "model.onnx")
    for name in ["W1", "W2"]:  # held stubs (>= 1 KiB): external
        info = {e.key: e.value for e in saved[name].external_data}
        assert (
            saved[name].data_location == TensorProto.EXTERNAL
            and info["location"] == "model.onnx.data"
        )
        assert int(info["offset"]) % 64 == 0
    assert saved["b1"].data_location != TensorProto.EXTERNAL  # small ones stay inline
    assert saved["b2"].data_location != TensorProto.EXTERNAL
    loaded = onnx.load(tmp_path / "model.onnx")  # onnx resolves the relative locations
    for init in model.graph.initializer:
        (same,) = [i for i in loaded.graph.initializer if i.name == init.name]
        np.testing.assert_array_equal(numpy_helper.to_array(same), numpy_helper.to_array(init))
    assert loaded.ir_version <= 10
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_weights_from_an_external_data_file_move_with_the_model(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    onnx.save_model(
        mlp(), src / "m.onnx", save_as_external_data=True, location="m.bin", size_threshold=0
    )
    expected = run_reference(mlp())
    model = load_model(src / "m.onnx")
    assert all(i.data_location == TensorProto.EXTERNAL for i in model.graph.initializer)
    acc = build_scaled(model, src / "m.onnx")
    out = tmp_path / "out"
    out.mkdir()
    save_model(acc.working_model, out / "scaled.onnx", acc.weights, location="weights.bin")
    (got,) = run_file(out / "scaled.onnx", {"x": X})
    np.testing.assert_array_equal(got, 2 * expected)
    assert sorted(p.name for p in out.iterdir()) == ["scaled.onnx", "weights.bin"]


def test_existing_external_data_is_copied_with_base_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    onnx.save_model(
        mlp(), src / "m.onnx", save_as_external_data=True, location="m.bin", size_threshold=0
    )
    model = onnx.load(src / "m.onnx", load_external_data=False)
    with pytest.raises(ValueError, match="base_dir"):
        save_model(model, tmp_path / "copy.onnx")
    save_model(model, tmp_path / "copy.onnx", base_dir=src)
    np.testing.assert_array_equal(
        run_file(tmp_path / "copy.onnx", {"x": X})[0], run_reference(mlp())
    )


@pytest.mark.parametrize(
    ("threshold", "external"), [(0, {"W1", "b1", "W2", "b2"}), (1024, {"W1", "W2"}), (10**9, set())]
)
def test_threshold_for_inline_initializers(tmp_path, threshold, external):
    save_model(mlp(), tmp_path / "m.onnx", external_data_threshold=threshold)
    saved = initializers(tmp_path / "m.onnx")
    assert {n for n, i in saved.items() if i.data_location == TensorProto.EXTERNAL} == external
    assert (tmp_path / "m.onnx.data").exists() == bool(external)
    np.testing.assert_array_equal(run_file(tmp_path / "m.onnx", {"x": X})[0], run_reference(mlp()))


def test_weights_mapping_and_streaming(tmp_path):
    acc = build_scaled(mlp())
    log: list[int] = []
    weights = {}
    for name in acc.weights:
        s = acc.weights.source(name)
        weights[name] = RecordingSource(s.name, s.data_type, s.dims, tensor=s.tensor, log=log)
    save_model(acc.working_model, tmp_path / "m.onnx", weights)
    assert sum(log) == sum(w.nbytes for w in weights.values())
    np.testing.assert_array_equal(
        run_file(tmp_path / "m.onnx", {"x": X})[0], 2 * run_reference(mlp())
    )


@dataclass(frozen=True)
class Broken(TensorSource):
    def chunks(self, chunk_bytes=16 * 1024 * 1024):
        yield b"\0" * 128
        raise OSError("read error")


def test_failed_save_leaves_old_files_and_no_temps(tmp_path):
    save_model(mlp(), tmp_path / "m.onnx")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    acc = build_scaled(mlp())
    weights = {
        n: Broken(
            n,
            acc.weights.source(n).data_type,
            acc.weights.source(n).dims,
            tensor=acc.weights.source(n).tensor,
        )
        for n in acc.weights
    }
    with pytest.raises(OSError, match="read error"):
        save_model(acc.working_model, tmp_path / "m.onnx", weights)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_atomic_outputs_replaces_in_order_or_not_at_all(tmp_path):
    (tmp_path / "a").write_text("old a")
    with atomic_outputs(tmp_path / "a", tmp_path / "b") as (ta, tb):
        ta.write_text("new a")
        tb.write_text("new b")
        assert not (tmp_path / "b").exists()
    assert (tmp_path / "a").read_text() == "new a" and (tmp_path / "b").read_text() == "new b"
    with pytest.raises(KeyError), atomic_outputs(tmp_path / "a") as (ta,):
        ta.write_text("half")
        raise KeyError("boom")
    assert (tmp_path / "a").read_text() == "new a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    mode = (tmp_path / "a").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # like a plainly created file, not mkstemp's 0600


def test_errors(tmp_path):
    acc = build_scaled(mlp())
    with pytest.raises(ValueError, match="'W1' is a held stub.*accessor.weights"):
        save_model(acc.working_model, tmp_path / "m.onnx")
    for location in ["../escape.data", "/abs/path.data", ""]:
        with pytest.raises(ValueError, match="relative to the model's directory"):
            save_model(mlp(), tmp_path / "m.onnx", location=location)
    with pytest.raises(ValueError, match="is the model file itself"):
        save_model(mlp(), tmp_path / "m.onnx", location="m.onnx")
    wrong = {
        n: TensorSource(
            n, TensorProto.FLOAT, (1,), tensor=numpy_helper.from_array(np.zeros(1, np.float32))
        )
        for n in acc.weights
    }
    with pytest.raises(
        ValueError, match=r"weights for 'W1' are float\[1\] but the model's stub is float\[16, 64\]"
    ):
        save_model(acc.working_model, tmp_path / "m.onnx", wrong)
    with pytest.raises(ValueError, match="external_data_threshold"):
        save_model(mlp(), tmp_path / "m.onnx", external_data_threshold=-5)
    with pytest.raises(TypeError, match="ModelProto"):
        save_model(str(tmp_path), tmp_path / "m.onnx")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_model(mlp(), tmp_path / "missing" / "m.onnx")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "none.onnx")
    assert list(tmp_path.iterdir()) == []


def test_atomic_file_replaces_one_file_and_its_companions(tmp_path):
    from onnxblocks.io import atomic_file

    target = tmp_path / "ckpt"
    target.write_text("old")
    with atomic_file(target) as temp:
        assert temp.parent == tmp_path and not temp.exists()
        temp.write_text("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new"
    with atomic_file(target, companions=True) as temp:  # e.g. ONNX Runtime's <checkpoint>.data
        temp.write_text("main")
        temp.with_name(temp.name + ".data").write_text("data")
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "ckpt": "main",
        "ckpt.data": "data",
    }
    with pytest.raises(KeyError), atomic_file(target, companions=True) as temp:
        temp.write_text("half")
        temp.with_name(temp.name + ".data").write_text("half data")
        raise KeyError("boom")
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "ckpt": "main",
        "ckpt.data": "data",
    }
    with (
        pytest.raises(FileNotFoundError, match="does not exist"),
        atomic_file(tmp_path / "missing" / "x"),
    ):
        pass
