"""User properties stored in a checkpoint, exactly.

ONNX Runtime keeps checkpoint properties as int64, **float32** or str. A Python
float such as a learning rate or a loss would lose precision as float32, and
dicts (an RNG state, a scheduler's settings) do not fit at all. So:

* ``int`` (not ``bool``) and ``str`` values are stored as they are;
* a ``float`` exactly representable in float32 is stored as a float;
* everything else that JSON can encode (other floats, bools, None, lists,
  dicts) is stored as a str ``"onnxblocks-json:" + json.dumps(value)``, which
  round-trips exactly (Python writes floats with ``repr``).

:func:`decode` turns what the checkpoint holds back into the original values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError

JSON_MARKER = "onnxblocks-json:"
#: Prefix of the properties the runtime itself stores (step counter, data state ...).
RESERVED_PREFIX = "onnxblocks."


def encode(value: Any, name: str = "property") -> int | float | str:
    """Encode one property value for ONNX Runtime's checkpoint.

    Raises:
        TypeError: if the value cannot be encoded as JSON.
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        as_int = int(value)
        if -(2**63) <= as_int < 2**63:
            return as_int
    if isinstance(value, str) and not value.startswith(JSON_MARKER):
        return value
    if isinstance(value, (float, np.floating)) and float(np.float32(value)) == float(value):
        return float(value)
    try:
        return JSON_MARKER + json.dumps(_plain(value), allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise InvalidTypeError(
            f"checkpoint property '{name}' of type {type(value).__name__} cannot be stored "
            f"({exc}). "
            "Use int, float, str, or a JSON-encodable list/dict of them."
        ) from None


def decode(value: int | float | str) -> Any:
    """Turn a stored property back into the value that was saved."""
    if isinstance(value, str) and value.startswith(JSON_MARKER):
        return json.loads(value[len(JSON_MARKER) :])
    return value


def check_names(properties: Mapping[str, Any]) -> None:
    """Reject property names that are not str or that use the runtime's reserved prefix.

    Raises:
        TypeError: for a name that is not a str.
        ValueError: for a name starting with ``"onnxblocks."``.
    """
    for name in properties:
        if not isinstance(name, str):
            raise InvalidTypeError(
                f"checkpoint property names must be str, not {type(name).__name__} ({name!r})."
            )
        if name.startswith(RESERVED_PREFIX):
            raise InvalidValueError(
                f"checkpoint property '{name}' uses the prefix '{RESERVED_PREFIX}', which the "
                "runtime "
                "reserves for its own state. Choose another name."
            )


def _plain(value: Any) -> Any:
    """Convert numpy scalars and arrays to Python objects, recursively, for json."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
