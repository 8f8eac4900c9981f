"""Typed access to the attributes of an ``ir.Node``, with errors that name the node.

Each accessor without ``default`` requires the attribute (``ValueError`` naming
the node otherwise); with ``default`` (None included) an absent attribute gives
``default``. An attribute of another type raises ``ValueError``. ``INT`` attributes
read as floats where a float is asked for, as ``float()`` would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError

_T = TypeVar("_T")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of the accessors: the attribute must be present.
REQUIRED: Final = _Required()

_A = ir.AttributeType


def value(node: ir.Node, name: str, default: Any = None) -> Any:
    """The Python value of attribute ``name`` (a tensor as a numpy array), or ``default``."""
    attr = node.attributes.get(name)
    if attr is None or attr.is_ref():
        return default
    if attr.type == _A.TENSOR:
        return attr.as_tensor().numpy()
    if attr.type in (_A.INTS, _A.FLOATS, _A.STRINGS):
        return list(attr.value)
    return attr.value


def _typed(
    node: ir.Node,
    name: str,
    default: Any,
    kind: str,
    types: tuple[ir.AttributeType, ...],
    convert: Callable,
) -> Any:
    attr = node.attributes.get(name)
    if attr is None or attr.is_ref() or attr.type == _A.UNDEFINED:
        if default is REQUIRED:
            raise InvalidValueError(
                f"Node '{node.name}' ({node.op_type}) has no attribute '{name}' ({kind})."
            )
        return (
            list(default)
            if isinstance(default, Sequence) and not isinstance(default, str)
            else default
        )
    if attr.type not in types:
        shown = repr(attr.value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise InvalidValueError(
            f"Node '{node.name}' ({node.op_type}): attribute '{name}' should be {kind}, got "
            f"{attr.type.name} {shown}."
        )
    return convert(attr.value)


def int_attribute(node: ir.Node, name: str, default: Any = REQUIRED) -> Any:
    """An ``INT`` attribute."""
    return _typed(node, name, default, "an int", (_A.INT,), int)


def float_attribute(node: ir.Node, name: str, default: Any = REQUIRED) -> Any:
    """A ``FLOAT`` attribute (an ``INT`` one is read as a float)."""
    return _typed(node, name, default, "a float", (_A.FLOAT, _A.INT), float)


def string_attribute(node: ir.Node, name: str, default: Any = REQUIRED) -> Any:
    """A ``STRING`` attribute."""
    return _typed(node, name, default, "a string", (_A.STRING,), str)


def ints_attribute(node: ir.Node, name: str, default: Any = REQUIRED) -> Any:
    """An ``INTS`` attribute, as a new list (``default`` copied)."""
    return _typed(node, name, default, "a list of ints", (_A.INTS,), lambda v: [int(x) for x in v])


def floats_attribute(node: ir.Node, name: str, default: Any = REQUIRED) -> Any:
    """A ``FLOATS`` attribute, as a new list (``default`` copied)."""
    return _typed(
        node, name, default, "a list of floats", (_A.FLOATS,), lambda v: [float(x) for x in v]
    )


def strings_attribute(node: ir.Node, name: str, default: Any = REQUIRED) -> Any:
    """A ``STRINGS`` attribute, as a new list (``default`` copied)."""
    return _typed(
        node, name, default, "a list of strings", (_A.STRINGS,), lambda v: [str(x) for x in v]
    )
