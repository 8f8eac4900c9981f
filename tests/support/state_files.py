"""State files (``params.safetensors``) written by hand: valid ones, and a corpus of bad ones.

:func:`encode` writes a safetensors file from a list of ``(name, entry)`` header
pairs (so a name can appear twice) and the data bytes, without any check;
:func:`corpus` writes the bad files both readers must refuse (Python's
``onnxblocks.web.read_state`` and the JavaScript client's ``parseState``), each
named for what is wrong with it, and a few good ones both must read.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

FORMAT = "onnxblocks-web/1"


def encode(pairs: list[tuple[str, object]], data: bytes) -> bytes:
    """A safetensors file with the header ``pairs`` (in order, repeats kept) and ``data`` after it."""
    text = (
        "{"
        + ",".join(f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))}" for k, v in pairs)
        + "}"
    )
    raw = text.encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def metadata(**overrides: object) -> dict[str, str]:
    """The ``__metadata__`` of a one-parameter state (``w``, trainable), with ``overrides`` (None drops a key)."""
    meta: dict[str, object] = {
        "format": FORMAT,
        "trainable": '["w"]',
        "frozen": '["f"]',
        "step": "3",
        "learning_rate": "0.01",
        "properties": '{"epoch": ["int", 2]}',
    }
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}  # type: ignore[misc]


def _tensors() -> list[tuple[str, np.ndarray]]:
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    return [
        ("w", w),
        ("w.exp_avg", w * 0.5),
        ("w.exp_avg_sq", w * 0.25),
        ("f", np.array([7, 8, 9], dtype=np.int64)),
    ]


def good_pairs(**meta: object) -> tuple[list[tuple[str, object]], bytes]:
    """The header pairs and data of a valid state (``meta`` overrides metadata keys)."""
    pairs: list[tuple[str, object]] = [("__metadata__", metadata(**meta))]
    data = b""
    codes = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}
    for name, array in _tensors():
        begin = len(data)
        data += array.tobytes()
        pairs.append(
            (
                name,
                {
                    "dtype": codes[array.dtype],
                    "shape": list(array.shape),
                    "data_offsets": [begin, len(data)],
                },
            )
        )
    return pairs, data


def _with(pairs: list[tuple[str, object]], name: str, **fields: object) -> list[tuple[str, object]]:
    out = []
    for key, value in pairs:
        if key == name and isinstance(value, dict):
            value = {**value, **fields}
        out.append((key, value))
    return out


def bad_files() -> dict[str, bytes]:
    """The corpus of bad state files, by what is wrong (every reader must refuse each)."""
    pairs, data = good_pairs()
    offsets = {
        k: v["data_offsets"] for k, v in pairs if isinstance(v, dict) and "data_offsets" in v
    }
    files = {
        "overlapping-offsets": encode(_with(pairs, "w.exp_avg", data_offsets=[8, 24]), data),
        "aliased-tensors": encode(_with(pairs, "w.exp_avg", data_offsets=offsets["w"]), data),
        "offsets-past-end": encode(_with(pairs, "f", data_offsets=[56, 80]), data[:56]),
        "offsets-reversed": encode(_with(pairs, "f", data_offsets=[72, 48]), data),
        "offsets-not-integers": encode(_with(pairs, "f", data_offsets=[48.0, 72.0]), data),
        "gap-between-tensors": encode(_with(pairs, "f", data_offsets=[52, 76]), data + b"\0" * 4),
        "offsets-beyond-data": encode(_with(pairs, "w.exp_avg", data_offsets=[1000, 1016]), data),
        "offsets-negative": encode(_with(pairs, "w.exp_avg", data_offsets=[-16, 0]), data),
        "moved-onto-another": encode(
            _with(pairs, "w.exp_avg", data_offsets=offsets["w.exp_avg_sq"]), data
        ),
        "header-length-huge": struct.pack("<Q", 2**63) + encode(pairs, data)[8:],
        "trailing-bytes": encode(pairs, data + b"\0" * 8),
        "truncated-data": encode(pairs, data[:-5]),
        "truncated-header": encode(pairs, data)[:20],
        "shape-overflow": encode(_with(pairs, "w", shape=[2**32, 2**32]), data),
        "shape-of-booleans": encode(_with(pairs, "w", shape=[True, 4]), data),
        "shape-negative": encode(_with(pairs, "w", shape=[-2, -2]), data),
        "shape-size-mismatch": encode(_with(pairs, "w", shape=[3, 2]), data),
        "dtype-unknown": encode(_with(pairs, "w", dtype="BF16"), data),
        "repeated-name": encode([*pairs, ("w", dict(pairs)["w"])], data),
        "repeated-parameter-in-list": encode(good_pairs(trainable='["w", "w"]')[0], data),
        "trainable-and-frozen": encode(good_pairs(frozen='["f", "w"]')[0], data),
        "stray-tensor": encode(good_pairs(frozen="[]")[0], data),
        "one-moment-only": encode(
            _with([p for p in pairs if p[0] != "w.exp_avg_sq"], "f", data_offsets=[32, 56]),
            data[:32] + data[48:],
        ),
        "learning-rate-nan": encode(good_pairs(learning_rate="NaN")[0], data),
        "learning-rate-negative": encode(good_pairs(learning_rate="-0.5")[0], data),
        "learning-rate-past-float32": encode(good_pairs(learning_rate="1e40")[0], data),
        "learning-rate-string": encode(good_pairs(learning_rate='"a"')[0], data),
        "learning-rate-boolean": encode(good_pairs(learning_rate="true")[0], data),
        "step-negative": encode(good_pairs(step="-1")[0], data),
        "step-past-2**53": encode(good_pairs(step=str(2**63 - 1))[0], data),
        "step-not-decimal": encode(good_pairs(step="1e3")[0], data),
        "property-wrong-kind": encode(good_pairs(properties='{"epoch": ["int", "two"]}')[0], data),
        "property-int-past-int64": encode(
            good_pairs(properties=json.dumps({"n": ["int", 2**63]}))[0], data
        ),
        "metadata-not-strings": encode(
            [("__metadata__", {"format": FORMAT, "step": 3}), *pairs[1:]], data
        ),
        "format-missing": encode(good_pairs(format=None)[0], data),
        "too-short": b"\x08\0\0",
    }
    assert math.prod([2**32, 2**32]) * 4 > len(data)  # the overflow case cannot fit by accident
    return files


#: The tensor each refusal must name (the one whose header entry is wrong, or both of an overlap), in
#: both readers; the other bad files are wrong as a whole (their header, metadata or length).
OFFENDERS = {
    "overlapping-offsets": "w.exp_avg",
    "aliased-tensors": "w.exp_avg",
    "offsets-past-end": "f",
    "offsets-reversed": "f",
    "offsets-not-integers": "f",
    "gap-between-tensors": "f",
    "offsets-beyond-data": "w.exp_avg",
    "offsets-negative": "w.exp_avg",
    "moved-onto-another": "w.exp_avg",
    "truncated-data": "f",
    "shape-overflow": "w",
    "shape-of-booleans": "w",
    "shape-negative": "w",
    "shape-size-mismatch": "w",
    "dtype-unknown": "w",
    "repeated-name": "w",
}


def good_files() -> dict[str, bytes]:
    """State files every reader must accept."""
    pairs, data = good_pairs()
    return {
        "complete": encode(pairs, data),
        "no-learning-rate": encode(good_pairs(learning_rate=None)[0], data),
        "offsets-out-of-header-order": encode([pairs[0], *reversed(pairs[1:])], data),
        "learning-rate-zero": encode(good_pairs(learning_rate="0")[0], data),
        "step-2**53-1": encode(good_pairs(step=str(2**53 - 1))[0], data),
    }


def corpus(directory: Path) -> dict[str, bool]:
    """Write the corpus into ``directory`` as ``<case>.safetensors``; return ``{case: must be accepted}``."""
    directory.mkdir(parents=True, exist_ok=True)
    verdicts = {}
    for accept, files in ((False, bad_files()), (True, good_files())):
        for name, raw in files.items():
            (directory / f"{name}.safetensors").write_bytes(raw)
            verdicts[name] = accept
    return verdicts
