"""Model files with bad external data (outside the model directory, wrong length, past the end) are refused.

Each test is one bad input or environment, asserting the exact behaviour: the exception type, the offender
it names, and the directory before and after.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support.runtime_support import listing

from onnxblocks.checkpoint import (
    save_checkpoint,
)
from onnxblocks.io import load_model, save_model


# =========================================================================== external data
def _external_model(directory: Path, location: str, length: int | None = None) -> Path:
    """``y = W`` with a 4-float ``W`` stored externally at ``location`` (relative to ``directory``)."""
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": "0"}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", 1, [4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = directory / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize(
    "location", ["../outside.bin", "/abs/outside.bin", "sub/../../outside.bin", "link.bin"]
)
def test_external_data_outside_the_model_directory_is_refused(tmp_path, location):
    (tmp_path / "outside.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "link.bin").symlink_to(tmp_path / "outside.bin")
    path = _external_model(model_dir, location)
    with pytest.raises(Exception) as onnx_refuses:  # what onnx.load does, for comparison
        onnx.load(path)
    assert type(onnx_refuses.value).__name__ == "ValidationError"
    model = onnx.load(path, load_external_data=False)
    before = listing(tmp_path)
    with pytest.raises(ValueError, match="Initializer 'W'") as info:
        save_checkpoint(([model.graph.initializer[0]], []), tmp_path / "ck", base_dir=model_dir)
    assert (
        "symbolic link" in str(info.value)
        if location == "link.bin"
        else repr(location) in str(info.value)
    )
    with pytest.raises(ValueError, match="Initializer 'W'"):
        save_model(model, tmp_path / "copy.onnx", base_dir=model_dir)
    with pytest.raises(ValueError, match="Initializer 'W'"):
        import onnxblocks

        with onnxblocks.base(model, model_path=path):
            pass
    with pytest.raises(ValueError, match=f"Cannot load '{path}' as an ONNX model"):
        load_model(path, load_external_data=True)
    assert listing(tmp_path) == before  # nothing written


@pytest.mark.parametrize("length", [8, 32])
def test_external_data_length_other_than_the_dims_need_is_refused(tmp_path, length):
    (tmp_path / "w.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    path = _external_model(tmp_path, "w.bin", length=length)
    model = onnx.load(path, load_external_data=False)
    before = listing(tmp_path)
    with pytest.raises(ValueError, match=f"Initializer 'W' declares {length} bytes .* need 16"):
        save_checkpoint(([model.graph.initializer[0]], []), tmp_path / "ck", base_dir=tmp_path)
    from onnxblocks import artifacts

    with pytest.raises(ValueError, match="Initializer 'W' declares"):
        artifacts.generate_artifacts(
            path,
            requires_grad=["W"],
            loss=None,
            optimizer=None,
            artifact_directory=tmp_path / "out",
        )
    assert listing(tmp_path) == before  # no unloadable checkpoint, no artifact directory


def test_external_data_past_the_end_of_its_file_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(2, dtype=np.float32).tobytes())
    model = onnx.load(_external_model(tmp_path, "w.bin"), load_external_data=False)
    with pytest.raises(ValueError, match="'W' needs bytes 0..16 of .*which has only 8 bytes"):
        save_checkpoint(([model.graph.initializer[0]], []), tmp_path / "ck", base_dir=tmp_path)
    assert not (tmp_path / "ck").exists()


def test_bad_model_files_raise_value_errors_naming_them(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    with pytest.raises(
        ValueError, match=f"Cannot load '{tmp_path / 'junk.onnx'}' as an ONNX model"
    ):
        load_model(tmp_path / "junk.onnx")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        load_model(tmp_path)
