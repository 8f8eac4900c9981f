"""Checkpoints trusted in nothing (hypothesis): written and read back exactly, or, mutated, refused naming the file.

Any checkpoint ``save_checkpoint`` writes (parameters of several dtypes and shapes,
an optimizer group with step, learning rate and moments, properties) is read back
exactly. A checkpoint with one byte changed, cut short, or with its step or
learning rate replaced by a value the session's setters refuse (NaN, negative,
past float32, past 2**53) is refused with an ``OnnxBlocksError`` naming the file,
or, when it still is a valid checkpoint, read back consistently (what was read
is saved and read again unchanged, and its scalars pass the setters' checks).
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onnxblocks.checkpoint import check_checkpoint, load_checkpoint, save_checkpoint
from onnxblocks.errors import OnnxBlocksError

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
#: Distinctive values, so a mutation can find their bytes in the file.
STEP, LEARNING_RATE = 0x0102030405, 0.123456789
_DTYPES = st.sampled_from([np.float32, np.float64, np.int64, np.int32, np.uint8])
_SHAPES = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


def _array(draw, dtype, shape) -> np.ndarray:
    size = math.prod(shape) * np.dtype(dtype).itemsize
    raw = draw(st.binary(min_size=size, max_size=size))
    return np.frombuffer(raw, dtype=np.uint8).copy().view(dtype).reshape(shape)


@st.composite
def checkpoints(draw):
    names = draw(
        st.lists(
            st.text("abcwxyz._0123", min_size=1, max_size=6), min_size=1, max_size=4, unique=True
        )
    )
    cut = draw(st.integers(1, len(names)))
    trainable = {
        n: _array(draw, np.float32 if draw(st.booleans()) else np.float64, draw(_SHAPES))
        for n in names[:cut]
    }
    frozen = {n: _array(draw, draw(_DTYPES), draw(_SHAPES)) for n in names[cut:]}
    moments = {
        n: [_array(draw, a.dtype, a.shape), _array(draw, a.dtype, a.shape)]
        for n, a in trainable.items()
    }
    properties = draw(
        st.dictionaries(
            st.text(min_size=1, max_size=8),
            st.one_of(
                st.integers(-(2**63), 2**63 - 1),
                st.floats(width=32, allow_nan=False),
                st.text(max_size=8),
            ),
            max_size=3,
        )
    )
    group = {"step": STEP, "initial_learning_rate": LEARNING_RATE, "moments": moments}
    return trainable, frozen, {"group0": group}, properties


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), name


def _same_properties(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:  # floats are stored as float32 and read back as that float32's value
        assert a[name] == b[name] or (
            isinstance(b[name], float) and np.float32(b[name]) == a[name]
        ), name


@SETTINGS
@given(case=checkpoints())
def test_any_checkpoint_written_is_read_back_exactly(tmp_path, case):
    trainable, frozen, optimizer, properties = case
    path = save_checkpoint(
        (trainable, frozen), tmp_path / "ckpt", optimizer_state=optimizer, properties=properties
    )
    back = load_checkpoint(path)
    _same(back.trainable, trainable)
    _same(back.frozen, frozen)
    group = back.optimizer_state["group0"]
    assert group["step"] == STEP and group["initial_learning_rate"] == np.float32(LEARNING_RATE)
    for name, moments in optimizer["group0"]["moments"].items():
        _same(dict(enumerate(group["moments"][name])), dict(enumerate(moments)))
    _same_properties(back.properties, properties)
    check_checkpoint(path)


def _replace_once(raw: bytes, old: bytes, new: bytes) -> bytes:
    assume(raw.count(old) == 1)
    return raw.replace(old, new)


@st.composite
def mutations(draw, raw: bytes):
    kind = draw(st.sampled_from(["flip", "truncate", "learning_rate", "step"]))
    if kind == "flip":
        at = draw(st.integers(0, len(raw) - 1))
        return bytes(raw[:at]) + bytes([draw(st.integers(0, 255))]) + bytes(raw[at + 1 :]), None
    if (
        kind == "truncate"
    ):  # a flatbuffer may end in padding nothing reads: cutting only that leaves it valid
        return raw[: draw(st.integers(0, len(raw) - 1))], None
    if kind == "learning_rate":
        value = draw(st.sampled_from([math.nan, -1.0, math.inf, -math.inf, -1e-30]))
        return _replace_once(raw, struct.pack("<f", LEARNING_RATE), struct.pack("<f", value)), True
    value = draw(st.sampled_from([-1, -(2**63), 2**63 - 1, 2**53]))
    return _replace_once(raw, struct.pack("<q", STEP), struct.pack("<q", value)), True


@SETTINGS
@given(case=checkpoints(), data=st.data())
def test_a_mutated_checkpoint_is_read_back_consistently_or_refused_naming_it(tmp_path, case, data):
    trainable, frozen, optimizer, properties = case
    path = save_checkpoint(
        (trainable, frozen), tmp_path / "ckpt", optimizer_state=optimizer, properties=properties
    )
    raw, refuse = data.draw(mutations(path.read_bytes()))
    bad = tmp_path / "mutated"
    bad.write_bytes(raw)
    try:
        back = load_checkpoint(bad)
        check_checkpoint(bad)
    except OnnxBlocksError as exc:
        assert bad.name in str(exc), str(exc)
        assert "Traceback" not in str(exc) and ".cc:" not in str(exc)
        return
    except Exception as exc:  # a foreign exception is a failure of the reader
        pytest.fail(f"{type(exc).__name__} escaped: {exc}")
    assert refuse is not True, (
        "a checkpoint with a step or learning rate the setters refuse was read"
    )
    for group in back.optimizer_state.values():
        assert 0 <= group["step"] <= 2**53 - 1
        assert math.isfinite(group["initial_learning_rate"]) and group["initial_learning_rate"] >= 0
    if back.is_nominal:
        return
    again = save_checkpoint(
        (back.trainable, back.frozen),
        tmp_path / "again",
        optimizer_state=back.optimizer_state,
        properties=back.properties,
    )
    reread = load_checkpoint(again)
    _same(reread.trainable, back.trainable)
    _same(reread.frozen, back.frozen)
    _same_properties(reread.properties, back.properties)
