"""``hub.json``: the record of an artifact set's hub folder, written atomically, read back checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxblocks.errors import FileMissingError, InvalidValueError, OnnxBlocksError
from onnxblocks.hub import HubRecord, has_record, read_record, write_record


def _record(tmp_path: Path) -> HubRecord:
    return HubRecord(
        source=tmp_path / "hub",
        file="onnx/model.onnx",
        task="causal-lm",
        with_past=True,
        past_inputs=("past_key_values.0.key", "past_key_values.0.value"),
        present_outputs=("present.0.key", "present.0.value"),
        module_paths={"onnx::MatMul_7": "model.layers.0.self_attn.q_proj"},
        base_model="tiny-llama",
    )


def test_a_record_reads_back_equal_and_finds_its_source(tmp_path):
    record = _record(tmp_path)
    (tmp_path / "hub" / "onnx").mkdir(parents=True)
    (tmp_path / "hub" / "onnx" / "model.onnx").write_bytes(b"x")
    assert not has_record(tmp_path)
    write_record(record, tmp_path)
    assert has_record(tmp_path)
    back = read_record(tmp_path)
    assert back == record
    assert back.check_source() == tmp_path / "hub"
    assert back.source_file == tmp_path / "hub" / "onnx" / "model.onnx"


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("version", 2, "version"),
        ("file", "../model.onnx", "'file'"),
        ("file", "/etc/passwd", "'file'"),
        ("task", "translation", "'task'"),
        ("source", "relative/dir", "'source'"),
        ("with_past", "yes", "'with_past'"),
        ("past_inputs", "past", "'past_inputs'"),
        ("past_inputs", [], "'past_inputs' is empty"),
        ("present_outputs", [1], "'present_outputs'"),
        ("module_paths", ["a"], "'module_paths'"),
    ],
)
def test_a_bad_record_is_refused_by_field(tmp_path, field, value, says):
    write_record(_record(tmp_path), tmp_path)
    path = tmp_path / "hub.json"
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidValueError, match=says) as caught:
        read_record(tmp_path)
    assert str(path) in str(caught.value) and "from_hub" in str(caught.value)


def test_not_json_or_missing_says_what_to_do(tmp_path):
    with pytest.raises(FileMissingError, match="from_hub"):
        read_record(tmp_path)
    (tmp_path / "hub.json").write_text("[1, 2")
    with pytest.raises(InvalidValueError, match="not JSON"):
        read_record(tmp_path)
    (tmp_path / "hub.json").write_text("[1, 2]")
    with pytest.raises(OnnxBlocksError, match="JSON object"):
        read_record(tmp_path)


def test_a_moved_source_is_named(tmp_path):
    write_record(_record(tmp_path), tmp_path)
    with pytest.raises(FileMissingError, match="is gone"):
        read_record(tmp_path).check_source()
