"""A bad safetensors header is refused naming the tensor whose entry is wrong, by both readers.

The reported case: a web state whose ``fc1.weight`` offsets lie beyond the data was refused
naming ``fc2.weight`` and ``fc1.bias`` ("it leaves a gap"): each tensor's span is now checked
against the data before the tensors are tiled. The family, for every tensor of a two-layer state
(so first, middle and last in the data): offsets beyond the data, negative, reversed, a span
of the wrong length for dtype x shape, shifted onto a neighbour (overlap), moved exactly onto
another tensor (alias), shifted into padding (gap); and a huge header length. Python's reader
(``read_safetensors``, ``read_state``) and the JavaScript client's ``parseSafetensors`` must
each name the offender (both tensors of an overlap); the file is named too.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.state_files import encode

from onnxblocks.errors import OnnxBlocksError
from onnxblocks.safetensors import read_safetensors
from onnxblocks.web import WebState, read_state, write_state
from onnxblocks.web.npm import js_dir

STATE = WebState(
    trainable={
        "fc1.weight": np.arange(8, dtype=np.float32).reshape(2, 4),
        "fc1.bias": np.ones(2, np.float32),
        "fc2.weight": np.arange(8, dtype=np.float32).reshape(4, 2),
        "fc2.bias": np.zeros(2, np.float32),
    },
    frozen={},
    moments={},
    step=4,
    learning_rate=0.01,
    properties={},
)


def _state_file(tmp_path: Path) -> tuple[list[tuple[str, object]], bytes]:
    raw = write_state(STATE, tmp_path / "params.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return list(json.loads(raw[8 : 8 + length]).items()), raw[8 + length :]


def _offsets(pairs, name: str) -> list[int]:
    return dict(pairs)[name]["data_offsets"]


def _moved(pairs, name: str, offsets: list[int]) -> list[tuple[str, object]]:
    return [(k, {**v, "data_offsets": offsets} if k == name else v) for k, v in pairs]


def _family(pairs, data: bytes) -> dict[str, tuple[bytes, list[str]]]:
    """Bad files by ``kind/tensor``: their bytes and the names the refusal must hold."""
    names = [k for k in dict(pairs) if k != "__metadata__"]
    ordered = sorted(names, key=lambda n: _offsets(pairs, n))
    files = {}
    for name in names:
        begin, end = _offsets(pairs, name)
        span = end - begin
        index = ordered.index(name)
        last = index == len(ordered) - 1
        neighbour, shift = (
            (ordered[index - 1], -4) if last else (ordered[index + 1], 4)
        )  # shifted onto it
        other = next(
            n for n in names if n != name and np.diff(_offsets(pairs, n))[0] == span
        )  # same size
        cases = {
            "beyond-data": (
                _moved(pairs, name, [len(data) + 64, len(data) + 64 + span]),
                data,
                [name],
            ),
            "negative": (_moved(pairs, name, [-span, 0]), data, [name]),
            "reversed": (_moved(pairs, name, [end, begin]), data, [name]),
            "wrong-length": (_moved(pairs, name, [begin, end + 4]), data + b"\0" * 4, [name]),
            "overlap": (_moved(pairs, name, [begin + shift, end + shift]), data, [name, neighbour]),
            "gap": (
                _moved(pairs, name, [begin + 4, end + 4]) if last else None,
                data + b"\0" * 4,
                [name],
            ),
        }
        cases["alias"] = (_moved(pairs, name, _offsets(pairs, other)), data, [name, other])
        for kind, (header, body, named) in cases.items():
            if header is not None:
                files[f"{kind}-{name}"] = (encode(header, body), named)
    files["header-length-huge"] = (struct.pack("<Q", 2**63) + encode(pairs, data)[8:], ["header"])
    return files


def test_the_reported_case_names_the_tensor_outside_the_data(tmp_path):
    pairs, data = _state_file(tmp_path)
    begin, end = _offsets(pairs, "fc1.weight")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(encode(_moved(pairs, "fc1.weight", [begin + 4096, end + 4096]), data))
    for reader in (read_state, read_safetensors):
        with pytest.raises(OnnxBlocksError) as info:
            reader(bad)
        message = str(info.value)
        assert (
            "'fc1.weight'" in message
            and "outside the data" in message
            and "bad.safetensors" in message
        )
        assert "fc2.weight" not in message and "fc1.bias" not in message


def test_python_names_the_offender_of_each_bad_header(tmp_path):
    pairs, data = _state_file(tmp_path)
    family = _family(pairs, data)
    assert len(family) >= 4 * 6 + 1
    for case, (raw, named) in family.items():
        bad = tmp_path / f"{case}.safetensors"
        bad.write_bytes(raw)
        with pytest.raises(OnnxBlocksError) as info:
            read_safetensors(bad)
        message = str(info.value)
        assert bad.name in message, (case, message)
        for name in named:
            assert f"'{name}'" in message or (name == "header" and "header" in message), (
                case,
                message,
            )


_NODE_SCRIPT = """
import { readFileSync, readdirSync } from 'node:fs';
import { parseSafetensors } from '%s';
const dir = process.argv[1];
const out = {};
for (const file of readdirSync(dir)) {
  try {
    parseSafetensors(readFileSync(dir + '/' + file), file);
    out[file] = null;
  } catch (error) {
    out[file] = String(error.message);
  }
}
console.log(JSON.stringify(out));
"""


def test_javascript_names_the_same_offenders(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "Node.js is not on the PATH; this test needs Node 20+ (apt-get install nodejs)."
        )
    pairs, data = _state_file(tmp_path)
    family = _family(pairs, data)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for case, (raw, _) in family.items():
        (corpus / f"{case}.safetensors").write_bytes(raw)
    script = _NODE_SCRIPT % (js_dir() / "src" / "safetensors.mjs").as_uri()
    done = subprocess.run(
        [node, "--input-type=module", "-e", script, str(corpus)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    messages = json.loads(done.stdout.strip().splitlines()[-1])
    for case, (_, named) in family.items():
        message = messages[f"{case}.safetensors"]
        assert message is not None, f"{case}: read, not refused"
        for name in named:
            assert f"'{name}'" in message or (name == "header" and "header" in message), (
                case,
                message,
            )
