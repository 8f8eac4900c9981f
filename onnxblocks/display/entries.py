"""The entries of a graph as the display shows them: nodes, tensors, and ONNX types spelled as
numpy spells them.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx


@dataclass(frozen=True)
class NodeInfo:
    """One node of the graph, as the display sees it.

    Attributes:
        index: Position in ``graph.node``.
        name: The node's name, or ``"#<index>"`` for an unnamed node.
        op_type: The operator.
        domain: The operator's domain (``""`` for ai.onnx).
        inputs: Input value names (``""`` for omitted optional inputs).
        outputs: Output value names.
    """

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class TensorInfo:
    """A graph input, output, parameter or constant.

    Attributes:
        name: The value's name.
        role: ``"input"``, ``"output"``, ``"param"``, ``"constant"`` or ``"state"``
            (gradient buffers and ``lazy_reset_grad``).
        dtype: Element type in numpy spelling (``"float32"``), or ``"?"``.
        shape: Dims (ints, symbolic names, or None for unknown), or None for unknown rank.
        trainable: True (trainable), False (frozen) or None (not known) for parameters.
    """

    name: str
    role: str
    dtype: str
    shape: tuple[int | str | None, ...] | None
    trainable: bool | None = None

    @property
    def numel(self) -> int | None:
        """Number of elements when every dim is known, else None."""
        if self.shape is None:
            return None
        count = 1
        for d in self.shape:
            if not isinstance(d, int):
                return None
            count *= d
        return count

    @property
    def nbytes(self) -> int | None:
        """Size in bytes when the shape and dtype are known, else None."""
        count = self.numel
        size = _ITEMSIZE.get(self.dtype)
        if count is None or size is None:
            return None
        return count * size

    @property
    def shape_text(self) -> str:
        """The shape as text, e.g. ``[N, 8]``; ``?`` for unknown rank."""
        if self.shape is None:
            return "?"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"


_ITEMSIZE = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "float8e4m3fn": 1,
    "float8e4m3fnuz": 1,
    "float8e5m2": 1,
    "float8e5m2fnuz": 1,
}


def dtype_name(elem_type: int) -> str:
    """Numpy-style name of an ONNX element type (``onnx.TensorProto.FLOAT`` -> ``"float32"``)."""
    if not elem_type:
        return "?"
    try:
        name = onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return "?"
    return {"float": "float32", "double": "float64"}.get(name, name)


def type_shape(t: onnx.TypeProto) -> tuple[str, tuple[int | str | None, ...] | None]:
    """(dtype, shape) of a TypeProto; sequences show their element type as ``seq(float32)``."""
    kind = t.WhichOneof("value")
    if kind == "sequence_type":
        inner, _ = type_shape(t.sequence_type.elem_type)
        return f"seq({inner})", None
    if kind != "tensor_type":
        return (kind or "?"), None
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return dtype_name(tt.elem_type), None
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        which = d.WhichOneof("value")
        dims.append(
            d.dim_value if which == "dim_value" else d.dim_param if which == "dim_param" else None
        )
    return dtype_name(tt.elem_type), tuple(dims)
