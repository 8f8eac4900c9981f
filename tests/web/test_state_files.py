"""State files trusted in nothing: one corpus of bad files against both readers, and properties (hypothesis).

* The corpus (``support/state_files.py``): every bad file is refused by Python's
  ``read_state`` with an ``OnnxBlocksError`` naming the file, and by the JavaScript
  client's ``parseState`` (Node, no npm packages needed) with an error naming it;
  every good file is read by both, to the same step and learning rate.
* Properties: any state ``write_state`` writes is read back exactly (and as a
  checkpoint through ``state_to_checkpoint``); a file mutated in its offsets, shapes,
  dtypes, names, scalars, length or aliasing is read back exactly as mutated
  or refused with an ``OnnxBlocksError`` naming the file; the mutations that break a
  rule are always refused.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import state_files

from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.errors import OnnxBlocksError
from onnxblocks.web import WebState, read_state, state_to_checkpoint, write_state
from onnxblocks.web.npm import js_dir

MAX_STEP = 2**53 - 1
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _refused(path: Path, reader=read_state) -> OnnxBlocksError:
    with pytest.raises(OnnxBlocksError) as info:
        reader(path)
    assert path.name in str(info.value), str(info.value)
    assert "Traceback" not in str(info.value)
    return info.value


# --------------------------------------------------------------------------- the corpus, in Python and in Node
def test_python_refuses_every_bad_file_of_the_corpus_and_reads_the_good_ones(tmp_path):
    verdicts = state_files.corpus(tmp_path)
    for case, accept in verdicts.items():
        path = tmp_path / f"{case}.safetensors"
        if accept:
            state = read_state(path)
            np.testing.assert_array_equal(
                state.trainable["w"], np.arange(4, dtype=np.float32).reshape(2, 2)
            )
            np.testing.assert_array_equal(state.frozen["f"], [7, 8, 9])
        else:
            error = _refused(path)
            if case in state_files.OFFENDERS:
                assert f"'{state_files.OFFENDERS[case]}'" in str(error), (case, str(error))


_NODE_SCRIPT = """
import { readFileSync, readdirSync } from 'node:fs';
import { parseState } from '%s';
const dir = process.argv[1];
const out = {};
for (const file of readdirSync(dir).filter((f) => f.endsWith('.safetensors'))) {
  const what = dir + '/' + file;
  try {
    const state = parseState(readFileSync(what), what);
    out[file] = { ok: true, step: state.step, learningRate: state.learningRate, w: Array.from(state.tensors.get('w').data) };
  } catch (error) {
    out[file] = { ok: false, message: String(error.message), type: error.constructor.name };
  }
}
console.log(JSON.stringify(out));
"""


def test_javascript_client_gives_the_same_verdicts_on_the_corpus(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "Node.js is not on the PATH; this test needs Node 20+ (apt-get install nodejs)."
        )
    verdicts = state_files.corpus(tmp_path / "corpus")
    script = _NODE_SCRIPT % (js_dir() / "src" / "state.mjs").as_uri()
    done = subprocess.run(
        [node, "--input-type=module", "-e", script, str(tmp_path / "corpus")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(results) == sorted(f"{case}.safetensors" for case in verdicts)
    for case, accept in verdicts.items():
        result = results[f"{case}.safetensors"]
        assert result["ok"] is accept, (case, result)
        if accept:
            python = read_state(tmp_path / "corpus" / f"{case}.safetensors")
            assert result["step"] == python.step and result["learningRate"] == python.learning_rate
            assert result["w"] == python.trainable["w"].ravel().tolist()
        else:
            assert result["type"] in ("TypeError", "RangeError", "SyntaxError"), (case, result)
            assert f"{case}.safetensors" in result["message"], (case, result)
            if case in state_files.OFFENDERS:  # the same tensor as Python names
                assert f"'{state_files.OFFENDERS[case]}'" in result["message"], (case, result)


# --------------------------------------------------------------------------- properties
_FLOAT_DTYPES = st.sampled_from([np.float32, np.float64, np.float16])
_ANY_DTYPES = st.sampled_from(
    [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_]
)
_SHAPES = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
_NAMES = st.text("abcxyz_.0123", min_size=1, max_size=6).filter(
    lambda n: not n.endswith((".exp_avg", ".exp_avg_sq"))
)


def _array(draw, dtype, shape) -> np.ndarray:
    raw = draw(
        st.binary(
            min_size=math.prod(shape) * np.dtype(dtype).itemsize, max_size=math.prod(shape) * 8
        )
    )
    array = np.frombuffer(raw[: math.prod(shape) * np.dtype(dtype).itemsize], dtype=np.uint8).copy()
    if dtype == np.bool_:
        array = array % 2
    return array.view(dtype).reshape(shape)


@st.composite
def web_states(draw) -> WebState:
    names = draw(st.lists(_NAMES, min_size=1, max_size=4, unique=True))
    cut = draw(st.integers(1, len(names)))
    trainable, frozen, moments = {}, {}, {}
    for name in names[:cut]:
        dtype, shape = draw(_FLOAT_DTYPES), draw(_SHAPES)
        trainable[name] = _array(draw, dtype, shape)
        if draw(st.booleans()):
            moments[name] = [_array(draw, dtype, shape), _array(draw, dtype, shape)]
    for name in names[cut:]:
        frozen[name] = _array(draw, draw(_ANY_DTYPES), draw(_SHAPES))
    properties = draw(
        st.dictionaries(
            st.text(min_size=1, max_size=8),
            st.one_of(
                st.integers(-(2**63), 2**63 - 1),
                st.floats(width=32, allow_nan=False),
                st.text(max_size=10),
            ),
            max_size=3,
        )
    )
    return WebState(
        trainable=trainable,
        frozen=frozen,
        moments=moments,
        step=draw(st.integers(0, MAX_STEP)),
        learning_rate=draw(st.none() | st.floats(0, 3e38, allow_nan=False) | st.just(0.0)),
        properties=properties,
    )


def _same_arrays(a: dict, b: dict, checkpoint: bool = False) -> None:
    assert list(a) == list(b)
    for name in a:
        # a checkpoint holds a 0-d tensor as shape [1] (as ONNX Runtime's reader gives it back)
        shape = (1,) if checkpoint and b[name].shape == () else b[name].shape
        assert a[name].dtype == b[name].dtype and a[name].shape == shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def _same_state(back: WebState, state: WebState) -> None:
    _same_arrays(back.trainable, state.trainable)
    _same_arrays(back.frozen, state.frozen)
    assert sorted(back.moments) == sorted(state.moments)
    for name in state.moments:
        _same_arrays(dict(enumerate(back.moments[name])), dict(enumerate(state.moments[name])))
    assert back.step == state.step and back.learning_rate == state.learning_rate
    assert back.properties == state.properties


@SETTINGS
@given(state=web_states())
def test_any_state_written_is_read_back_exactly_also_as_a_checkpoint(tmp_path, state):
    path = write_state(state, tmp_path / "s.safetensors")
    back = read_state(path)
    _same_state(back, state)
    if any(
        a.dtype == np.float16 for a in state.parameters.values()
    ):  # ONNX Runtime loads no float16 parameter
        with pytest.raises(OnnxBlocksError, match="float16"):
            state_to_checkpoint(path, tmp_path / "ckpt")
        return
    checkpoint = load_checkpoint(state_to_checkpoint(path, tmp_path / "ckpt"))
    _same_arrays(checkpoint.trainable, state.trainable, checkpoint=True)
    _same_arrays(checkpoint.frozen, state.frozen, checkpoint=True)
    if state.step or state.moments:
        group = checkpoint.optimizer_state["group0"]
        assert group["step"] == state.step
        assert group["initial_learning_rate"] == np.float32(
            state.learning_rate if state.learning_rate is not None else 1e-3
        )
        for name, moments in state.moments.items():
            _same_arrays(
                dict(enumerate(group["moments"][name])), dict(enumerate(moments)), checkpoint=True
            )


# --- mutations: each returns (file bytes, must the reader refuse it?, what to expect when read)
def _split(raw: bytes) -> tuple[list[tuple[str, object]], bytes]:
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    return list(header.items()), raw[8 + length :]


def _tensor_names(pairs) -> list[str]:
    return [k for k, _ in pairs if k != "__metadata__"]


@st.composite
def mutations(draw, raw: bytes):
    pairs, data = _split(raw)
    names = _tensor_names(pairs)
    kind = draw(
        st.sampled_from(
            ["offsets", "shape", "dtype", "names", "scalar", "truncate", "alias", "flip"]
        )
    )
    header = dict(pairs)
    if kind == "flip":  # one byte anywhere: read back exactly as it now says, or refused
        at = draw(st.integers(0, len(raw) - 1))
        value = draw(st.integers(0, 255))
        return bytes(raw[:at]) + bytes([value]) + bytes(raw[at + 1 :]), None
    if kind == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))], True
    if kind == "scalar":
        key, value, refuse = draw(
            st.sampled_from(
                [
                    ("learning_rate", "NaN", True),
                    ("learning_rate", "-1e-3", True),
                    ("learning_rate", "1e40", True),
                    ("learning_rate", '"a"', True),
                    ("learning_rate", "true", True),
                    ("learning_rate", "0.25", False),
                    ("step", "-1", True),
                    ("step", str(2**63 - 1), True),
                    ("step", "5_0", True),
                    ("step", " 7", True),
                    ("step", "17", False),
                    ("properties", '{"a": ["int", true]}', True),
                    ("properties", '{"a": ["int", 1.5]}', True),
                    (
                        "properties",
                        '{"a": ["float", 0.1]}',
                        True,
                    ),  # not a float32: a checkpoint cannot hold it
                    ("properties", '{"a": ["str", 3]}', True),
                    ("properties", '{"a": ["float", 0.5]}', False),
                    ("trainable", "[1]", True),
                    ("frozen", '"x"', True),
                ]
            )
        )
        header["__metadata__"] = {**header["__metadata__"], key: value}
        return state_files.encode(list(header.items()), data), refuse
    name = draw(st.sampled_from(names))
    entry = dict(header[name])
    if kind == "offsets":
        new = [draw(st.integers(0, len(data) + 8)), draw(st.integers(0, len(data) + 8))]
        assume(new != entry["data_offsets"])
        header[name] = {**entry, "data_offsets": new}
        empty = (
            entry["data_offsets"][0] == entry["data_offsets"][1]
        )  # may sit at any tensor boundary
        return state_files.encode(list(header.items()), data), None if empty and new[0] == new[
            1
        ] else True
    if kind == "alias":
        others = [
            n
            for n in names
            if n != name
            and header[n]["data_offsets"] != entry["data_offsets"]
            and header[n]["data_offsets"][1] - header[n]["data_offsets"][0]
            == entry["data_offsets"][1] - entry["data_offsets"][0]
            > 0
        ]
        assume(others)
        other = draw(st.sampled_from(others))
        header[name] = {**entry, "data_offsets": header[other]["data_offsets"]}
        return state_files.encode(list(header.items()), data), True
    if kind == "shape":
        shape = draw(
            st.lists(
                st.one_of(st.integers(-3, 6), st.just(2**32), st.just(2**64), st.booleans()),
                max_size=4,
            )
        )
        assume(shape != entry["shape"])
        header[name] = {**entry, "shape": shape}
        # a new shape of the same size is a valid file (a reshape); a parameter then differs from its moments
        return state_files.encode(list(header.items()), data), None
    if kind == "dtype":
        code = draw(
            st.sampled_from(["F32", "F64", "F16", "I64", "U8", "BOOL", "BF16", "F8", "", "f32"])
        )
        assume(code != entry["dtype"])
        header[name] = {**entry, "dtype": code}
        return state_files.encode(list(header.items()), data), None
    # names: a tensor's name given twice, or renamed to a name nothing lists
    if draw(st.booleans()) or len(names) < 2:
        pairs = [*pairs, (name, entry)]
        return state_files.encode(pairs, data), True
    renamed = [(("zz_stray" if k == name else k), v) for k, v in pairs]
    return state_files.encode(renamed, data), True


def _consistent(state: WebState, raw: bytes) -> None:
    """What was read agrees with the file's bytes, read independently."""
    pairs, data = _split(raw)
    header = dict(pairs)
    for name, array in {
        **state.parameters,
        **{
            m: v
            for p in state.moments
            for m, v in zip((f"{p}.exp_avg", f"{p}.exp_avg_sq"), state.moments[p], strict=True)
        },
    }.items():
        begin, end = header[name]["data_offsets"]
        assert array.tobytes() == data[begin:end], name
        assert list(array.shape) == header[name]["shape"], name
    meta = header["__metadata__"]
    assert state.step == int(meta.get("step", "0")) <= MAX_STEP
    if state.learning_rate is not None:
        assert (
            math.isfinite(state.learning_rate)
            and 0 <= state.learning_rate <= np.finfo(np.float32).max
        )


@SETTINGS
@given(state=web_states(), data=st.data())
def test_a_mutated_state_file_is_read_back_exactly_or_refused_naming_it(tmp_path, state, data):
    path = write_state(state, tmp_path / "state.safetensors")
    raw, refuse = data.draw(mutations(path.read_bytes()))
    bad = tmp_path / "mutated.safetensors"
    bad.write_bytes(raw)
    try:
        back = read_state(bad)
    except OnnxBlocksError as exc:
        assert refuse is not False, f"a valid mutation was refused: {exc}"
        assert bad.name in str(exc), str(exc)
        return
    assert refuse is not True, "a mutation that breaks a rule was read"
    _consistent(back, raw)
    if raw == path.read_bytes():
        _same_state(back, state)
