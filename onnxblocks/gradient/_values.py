"""Reading a graph's values for the gradient passes: inferred types, shapes, element types, node
attributes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Final, TypeVar, overload

import onnx

from onnxblocks._core.errors import InvalidValueError

_T = TypeVar("_T")


def infer_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of the values of ``model`` from onnx shape inference (best effort, no weight bytes
    read).

    Data propagation is on: shapes computed with ``Shape`` / ``Concat`` / ``Gather``
    (as the exporters and the passes write ``Reshape`` targets) stay known. The same
    inference as :func:`onnxblocks.ir.types.infer_proto_types`, which it is.
    """
    from onnxblocks.ir.types import infer_proto_types

    return infer_proto_types(model)


def shape_of(types: dict[str, onnx.TypeProto], name: str) -> list[int | None] | None:
    """Static dims of a tensor value (None for a symbolic or unknown dim), or None for an unknown
    rank.
    """
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.WhichOneof("value") == "dim_value" else None
        for d in t.tensor_type.shape.dim
    ]


def elem_type(types: dict[str, onnx.TypeProto], name: str) -> int | None:
    """Element type of a tensor value, or None if unknown."""
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type":
        return None
    return t.tensor_type.elem_type or None


def attribute(node: onnx.NodeProto, name: str, default: object = None) -> object:
    """The value of a node attribute, or ``default``."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


class _Required(enum.Enum):
    REQUIRED = "required"


#: The default of the typed accessors below: the attribute must be present.
_REQUIRED: Final = _Required.REQUIRED


def static_dims(dims: Sequence[int | None] | None) -> list[int] | None:
    """``dims`` (from :func:`shape_of`) when every one is static, else None."""
    if dims is None:
        return None
    static = [d for d in dims if d is not None]
    return static if len(static) == len(dims) else None


def _typed_attribute(
    node: onnx.NodeProto,
    name: str,
    default: _T | _Required | None,
    kind: str,
    convert: Callable[[object], _T | None],
) -> _T | None:
    """The attribute converted by ``convert`` (None: not of the expected kind), ``default`` when
    absent.
    """
    value = attribute(node, name)
    if value is None:  # absent (or of type UNDEFINED)
        if default is _REQUIRED:
            raise InvalidValueError(
                f"Node '{node.name}' ({node.op_type}) has no attribute '{name}' ({kind})."
            )
        return default
    converted = convert(value)
    if converted is None:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise InvalidValueError(
            f"Node '{node.name}' ({node.op_type}): attribute '{name}' should be {kind}, "
            f"got {type(value).__name__} {shown}."
        )
    return converted


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _as_string(value: object) -> str | None:
    return value.decode() if isinstance(value, bytes) else None


def _as_ints(value: object) -> list[int] | None:
    if not isinstance(value, list) or not all(_as_int(v) is not None for v in value):
        return None
    return list(value)


def _as_floats(value: object) -> list[float] | None:
    if not isinstance(value, list) or not all(_as_float(v) is not None for v in value):
        return None
    return [float(v) for v in value]


def _as_strings(value: object) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, bytes) for v in value):
        return None
    return [v.decode() for v in value]


# Each typed accessor: without ``default`` the attribute must be present (ValueError
# naming the node otherwise); with ``default`` (None included) an absent attribute
# gives ``default``. An attribute of another type raises ValueError.
@overload
def int_attribute(node: onnx.NodeProto, name: str) -> int: ...
@overload
def int_attribute(node: onnx.NodeProto, name: str, default: int) -> int: ...
@overload
def int_attribute(node: onnx.NodeProto, name: str, default: None) -> int | None: ...
def int_attribute(
    node: onnx.NodeProto, name: str, default: int | _Required | None = _REQUIRED
) -> int | None:
    """An ``INT`` attribute."""
    return _typed_attribute(node, name, default, "an int", _as_int)


@overload
def float_attribute(node: onnx.NodeProto, name: str) -> float: ...
@overload
def float_attribute(node: onnx.NodeProto, name: str, default: float) -> float: ...
@overload
def float_attribute(node: onnx.NodeProto, name: str, default: None) -> float | None: ...
def float_attribute(
    node: onnx.NodeProto, name: str, default: float | _Required | None = _REQUIRED
) -> float | None:
    """A ``FLOAT`` attribute (an ``INT`` one is read as a float, as ``float()`` would)."""
    return _typed_attribute(node, name, default, "a float", _as_float)


@overload
def string_attribute(node: onnx.NodeProto, name: str) -> str: ...
@overload
def string_attribute(node: onnx.NodeProto, name: str, default: str) -> str: ...
@overload
def string_attribute(node: onnx.NodeProto, name: str, default: None) -> str | None: ...
def string_attribute(
    node: onnx.NodeProto, name: str, default: str | _Required | None = _REQUIRED
) -> str | None:
    """A ``STRING`` attribute, decoded from UTF-8."""
    return _typed_attribute(node, name, default, "a string", _as_string)


@overload
def ints_attribute(node: onnx.NodeProto, name: str) -> list[int]: ...
@overload
def ints_attribute(node: onnx.NodeProto, name: str, default: Sequence[int]) -> list[int]: ...
@overload
def ints_attribute(node: onnx.NodeProto, name: str, default: None) -> list[int] | None: ...
def ints_attribute(
    node: onnx.NodeProto, name: str, default: Sequence[int] | _Required | None = _REQUIRED
) -> list[int] | None:
    """An ``INTS`` attribute, as a new list (``default`` copied)."""
    fallback = list(default) if isinstance(default, Sequence) else default
    return _typed_attribute(node, name, fallback, "a list of ints", _as_ints)


@overload
def floats_attribute(node: onnx.NodeProto, name: str) -> list[float]: ...
@overload
def floats_attribute(node: onnx.NodeProto, name: str, default: Sequence[float]) -> list[float]: ...
@overload
def floats_attribute(node: onnx.NodeProto, name: str, default: None) -> list[float] | None: ...
def floats_attribute(
    node: onnx.NodeProto, name: str, default: Sequence[float] | _Required | None = _REQUIRED
) -> list[float] | None:
    """A ``FLOATS`` attribute, as a new list (``default`` copied)."""
    fallback = list(default) if isinstance(default, Sequence) else default
    return _typed_attribute(node, name, fallback, "a list of floats", _as_floats)


@overload
def strings_attribute(node: onnx.NodeProto, name: str) -> list[str]: ...
@overload
def strings_attribute(node: onnx.NodeProto, name: str, default: Sequence[str]) -> list[str]: ...
@overload
def strings_attribute(node: onnx.NodeProto, name: str, default: None) -> list[str] | None: ...
def strings_attribute(
    node: onnx.NodeProto, name: str, default: Sequence[str] | _Required | None = _REQUIRED
) -> list[str] | None:
    """A ``STRINGS`` attribute, each decoded from UTF-8, as a new list (``default`` copied)."""
    fallback = list(default) if isinstance(default, Sequence) else default
    return _typed_attribute(node, name, fallback, "a list of strings", _as_strings)


def set_attribute(node: onnx.NodeProto, name: str, value: object) -> None:
    """Set (or replace) a node attribute."""
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))
