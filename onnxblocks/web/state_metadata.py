"""The ``__metadata__`` fields of a web state file, each read trusting nothing.

``trainable`` and ``frozen`` (JSON lists of unique names), ``step`` (a decimal
integer), ``states`` (state tensors per parameter, 1 to ``MAX_STATES``),
``learning_rate`` (JSON) and ``properties`` (JSON ``{name: [kind, value]}``, each
value storable in a checkpoint as it is). Errors name the file and the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from onnxblocks._core.contracts import MAX_STATES
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.runtime import properties as _props

#: The kinds a property is stored as, by the name the file gives them.
KINDS: dict[str, type] = {"int": int, "float": float, "str": str}
#: A step or state count as the file writes it.
DECIMAL = re.compile(r"^[0-9]{1,20}$")


def step(metadata: dict[str, str], target: Path) -> int:
    """The ``step`` field (0 when absent)."""
    text = metadata.get("step", "0")
    if not DECIMAL.match(text):
        raise InvalidValueError(
            f"'{target}': __metadata__ step {text!r:.40} is not a decimal integer."
        )
    return int(text)


def names(metadata: dict[str, str], key: str, target: Path) -> list[str]:
    """The parameter names of field ``key`` (``trainable``, ``frozen``): a JSON list, no repeats."""
    try:
        listed = json.loads(metadata.get(key, "[]"))
    except (json.JSONDecodeError, RecursionError):
        listed = None
    if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        raise InvalidValueError(
            f"'{target}': __metadata__ {key} must be a JSON list of parameter names."
        )
    repeated = sorted({n for n in listed if listed.count(n) > 1})
    if repeated:
        raise InvalidValueError(
            f"'{target}': __metadata__ {key} lists {repeated[:5]} more than once."
        )
    return listed


def state_count(metadata: dict[str, str], target: Path) -> int:
    """The ``states`` metadata: state tensors per trainable parameter (2, AdamW's moments, when
    absent).
    """
    text = metadata.get("states", "2")
    if not (DECIMAL.match(text) and 1 <= int(text) <= MAX_STATES):
        raise InvalidValueError(
            f"'{target}': __metadata__ states {text!r:.40} must be an integer in [1, "
            f"{MAX_STATES}] (the optimizer's "
            "state tensors per parameter)."
        )
    return int(text)


def json_field(metadata: dict[str, str], key: str, target: Path) -> Any:
    """Field ``key`` decoded as JSON (None when absent)."""
    if key not in metadata:
        return None
    try:
        return json.loads(metadata[key])
    except (json.JSONDecodeError, RecursionError):
        raise InvalidValueError(
            f"'{target}': __metadata__ {key} {metadata[key]!r:.40} is not JSON."
        ) from None


def properties(metadata: dict[str, str], target: Path) -> dict[str, Any]:
    """The ``properties`` field: ``{name: (kind, value)}`` as the file holds them."""
    raw = json_field(metadata, "properties", target)
    raw = {} if raw is None else raw
    if not isinstance(raw, dict) or not all(
        isinstance(v, list) and len(v) == 2 and v[0] in KINDS for v in raw.values()
    ):
        raise InvalidValueError(
            f"'{target}': __metadata__ properties must be a JSON object of [kind, value] pairs, "
            "kind one of "
            f"{sorted(KINDS)}."
        )
    return {name: (kind, value) for name, (kind, value) in raw.items()}


def property_value(name: object, value: object) -> int | float | str:
    """A property's value (a ``(kind, value)`` pair from the file, or a plain value) as a
    checkpoint stores it, through the checks of ``set_properties``.
    """
    if not isinstance(name, str):
        raise InvalidTypeError(
            f"property names must be str, not {type(name).__name__} {name!r:.40}."
        )
    if isinstance(value, tuple):  # (kind, value) as the file holds it
        kind, value = value
        wrong = (
            (kind == "int" and (not isinstance(value, int) or isinstance(value, bool)))
            or (
                kind == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool))
            )
            or (kind == "str" and not isinstance(value, str))
        )
        if wrong:
            raise InvalidValueError(
                f"property '{name}' is of kind {kind!r} but holds {value!r:.40}."
            )
        value = float(value) if kind == "float" else value  # type: ignore[arg-type]
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        raise InvalidTypeError(
            f"property '{name}' must be an int, float or str, not {type(value).__name__}."
        )
    encoded = _props.encode(value, name)  # what set_properties stores
    if type(encoded) is not type(value):
        raise InvalidValueError(
            f"property '{name}' = {value!r:.40} cannot be stored in a checkpoint as it is (ints "
            "are int64, floats "
            "float32)."
        )
    return value
