"""Element types and shapes: onnx shape inference kept on the values, and the one reader of
them.

Types live on the values: the type and shape a value declares (``ir.Value.type`` /
``.shape``) and, beside them in the value's ``meta`` (:data:`INFERRED`, onnx-ir's store
for analysis results, never serialized), what inference found. :func:`infer_types`
is the one inference step: it runs onnx shape inference (with data propagation) over
the model once and gives each value whatever inference knows beyond what the value
declares. :func:`elem_type`, :func:`dtype`, :func:`shape` and :func:`dims` read a
value's type, inferred first; every pass and lowering reads types through them (or
:class:`ValueTypes`, the same reader as an object for the rewrite context).

Inferred types stay in memory: the files written and the graphs handed to ONNX
Runtime carry the declared types only, since onnx's inference is best effort (an
``Einsum`` over symbolic dims can come out with a dim of 1 that ONNX Runtime would
then enforce on a gradient input).

On the protobuf side of ONNX Runtime's gradient builder, :func:`infer_proto_types`
gives the same inference by value name, read with :func:`proto_elem_type` and
:func:`proto_shape`.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.ir.serde import to_proto


def infer_proto_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The type of every value of ``model``'s top-level graph that onnx shape inference knows, by
    name.

    Best effort: data propagation is on (shapes computed with ``Shape`` / ``Concat``
    / ``Gather`` stay known); when inference fails, the types the model declares.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:
            inferred = model
    g = inferred.graph
    types = {vi.name: vi.type for vi in list(g.value_info) + list(g.input) + list(g.output)}
    for init in g.initializer:
        types.setdefault(
            init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
        )
    return types


#: The key of ``ir.Value.meta`` holding the inferred ``(type, shape)`` of a value.
INFERRED = "onnxblocks.inferred_type"

_Typed = tuple[ir.TypeProtocol | None, ir.Shape | None]


def _typed(value: ir.Value) -> _Typed:
    """The type and shape of ``value``: inferred when inference said more, else declared."""
    found = value.meta.get(INFERRED)
    return found if found is not None else (value.type, value.shape)


def _score(typed: _Typed) -> int:
    type_, shape_ = typed
    if type_ is None and shape_ is None:
        return -1
    if shape_ is None:
        return 0
    return 1 + sum(2 if isinstance(d, int) else d.value is not None for d in shape_)


def known_dims(value: ir.Value | None) -> int:
    """How much a value's type says: -1 when it has none, 0 without a shape, else 1 + 2 per static
    dim + 1 per symbolic one (a number says more than a symbol).
    """
    return -1 if value is None else _score(_typed(value))


def has_type(value: ir.Value | None) -> bool:
    """True when ``value`` has a type, declared or inferred."""
    return value is not None and _typed(value)[0] is not None


def set_type(value: ir.Value, type_proto: onnx.TypeProto) -> bool:
    """Give ``value`` the type and shape of ``type_proto`` when that says more than ``value``'s
    own; True when it did.
    """
    if type_proto.WhichOneof("value") is None:
        return False
    candidate = _of_proto(type_proto)
    if _score(candidate) <= known_dims(value):
        return False
    value.meta[INFERRED] = candidate
    return True


def put_type(value: ir.Value, type_proto: onnx.TypeProto) -> None:
    """Give ``value`` the type and shape of ``type_proto`` as its inferred type, whatever it knew
    (a type the caller knows better than inference, e.g. of an op onnx has no schema for).
    """
    value.meta[INFERRED] = _of_proto(type_proto)


def declare_type(value: ir.Value, type_proto: onnx.TypeProto) -> None:
    """Make ``type_proto`` the type and shape ``value`` declares (what a file would say of it)."""
    value.type, value.shape = _of_proto(type_proto)


def _of_proto(type_proto: onnx.TypeProto) -> _Typed:
    return (
        ir.serde.deserialize_type_proto_for_type(type_proto),
        ir.serde.deserialize_type_proto_for_shape(type_proto),
    )


def forget_inferred(model: ir.Model) -> None:
    """Drop what inference wrote onto the values of ``model``'s top-level graph (declared types
    stay): a copy handed on starts from what its graph declares, as one read from a file would.
    """
    graph = model.graph
    for value in [*graph.inputs, *graph.initializers.values()]:
        value.meta.pop(INFERRED, None)
    for node in graph:
        for value in node.outputs:
            value.meta.pop(INFERRED, None)


def copy_type(value: ir.Value, like: ir.Value) -> None:
    """Give ``value`` the type and shape of ``like`` where they say more than its own."""
    if _score(_typed(like)) > known_dims(value):
        value.meta[INFERRED] = _typed(like)


def type_proto(value: ir.Value) -> onnx.TypeProto | None:
    """``value``'s type as a ``TypeProto`` (for onnx's inference of one node), or None."""
    type_, shape_ = _typed(value)
    if type_ is None:
        return None
    return ir.serde.serialize_value(ir.Value(name=value.name, type=type_, shape=shape_)).type


def infer_types(model: ir.Model) -> None:
    """Write what onnx shape inference knows onto the values of ``model``'s top-level graph.

    The one inference step: the model is serialized once for onnx's inference (no
    weight bytes are copied), and each value keeps the inferred type (in its ``meta``,
    :data:`INFERRED`) where it says more than the value declares.
    """
    inferred = infer_proto_types(to_proto(model))
    graph = model.graph
    values = [*graph.inputs, *graph.initializers.values()]
    values += [v for node in graph for v in node.outputs]
    for value in values:
        t = inferred.get(value.name or "")
        if t is not None:
            set_type(value, t)


def elem_type(value: ir.Value | None) -> int | None:
    """The ONNX element type (``onnx.TensorProto.FLOAT``...) of ``value``, or None when unknown."""
    type_ = None if value is None else _typed(value)[0]
    if not isinstance(type_, ir.TensorType):
        return None
    dtype_ = type_.dtype
    return None if dtype_ == ir.DataType.UNDEFINED else int(dtype_)


def dtype(value: ir.Value | None) -> np.dtype | None:
    """The numpy dtype of ``value``, or None when its element type is unknown."""
    elem = elem_type(value)
    return None if elem is None else np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))


def dims(value: ir.Value | None) -> list[int | str | None] | None:
    """Dims of ``value``: an int when static, the symbol's name when symbolic, None when unknown;
    None for an unknown rank (or a value that is no tensor).

    Two dims of one name are equal: inference carries the names through ``Shape`` and its
    arithmetic.
    """
    if value is None:
        return None
    type_, shape_ = _typed(value)
    if shape_ is None or not isinstance(type_, ir.TensorType | None):
        return None
    return [d if isinstance(d, int) else d.value for d in shape_]


def shape(value: ir.Value | None) -> list[int | None] | None:
    """Static dims of ``value`` (None for a symbolic or unknown dim), or None for an unknown
    rank.
    """
    found = dims(value)
    return None if found is None else [d if isinstance(d, int) else None for d in found]


def static_dims(dims_: list[int | None] | None) -> list[int] | None:
    """``dims_`` when every one is static, else None."""
    if dims_ is None:
        return None
    static = [d for d in dims_ if d is not None]
    return static if len(static) == len(dims_) else None


class ValueTypes:
    """The reader of a model's value types, after :meth:`infer` wrote them onto the values.

    Holds nothing: each method reads the value it is given (:func:`elem_type`,
    :func:`dtype`, :func:`shape`, :func:`dims`).
    """

    @classmethod
    def infer(cls, model: ir.Model) -> ValueTypes:
        """Write the inferred types onto ``model``'s values (:func:`infer_types`); their reader."""
        infer_types(model)
        return cls()

    elem = staticmethod(elem_type)
    dtype = staticmethod(dtype)
    shape = staticmethod(shape)
    dims = staticmethod(dims)


def proto_elem_type(types: dict[str, onnx.TypeProto], name: str) -> int | None:
    """Element type of a tensor value of :func:`infer_proto_types`'s result, or None if
    unknown.
    """
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type":
        return None
    return t.tensor_type.elem_type or None


def proto_shape(types: dict[str, onnx.TypeProto], name: str) -> list[int | None] | None:
    """Static dims of a tensor value of :func:`infer_proto_types`'s result (None for a symbolic
    or unknown dim), or None for an unknown rank.
    """
    t = types.get(name)
    if t is None or t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.WhichOneof("value") == "dim_value" else None
        for d in t.tensor_type.shape.dim
    ]
