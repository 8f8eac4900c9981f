"""Local checking of one node as it is added: schema, attributes, and output types from input types.

The whole model is checked once, when it is finished
(:func:`onnxblocks._core.validation.check_skeleton`); here each node is checked on
its own, so a build costs O(nodes added), not O(model) per block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import onnx
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError

#: Domains whose schemas onnx knows, so their nodes can be checked locally.
ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
#: Attribute types that hold subgraphs.
_GRAPH_ATTRIBUTES = frozenset({onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS})
#: Version imported for a domain the model does not import yet.
DEFAULT_DOMAIN_VERSIONS = {_limits.MS_DOMAIN: _limits.MS_OPSET, "ai.onnx.ml": 3}


def check_node(
    node: onnx.NodeProto,
    opsets: Mapping[str, int],
    type_of: Callable[[str], onnx.TypeProto | None],
    const_data: Mapping[str, onnx.TensorProto],
    where: str = "",
) -> dict[str, onnx.TypeProto]:
    """Check one node against its schema and infer its output types from its inputs'.

    Args:
        node: The node to check.
        opsets: The model's opset imports, ``{domain: version}`` (``""`` for ai.onnx).
        type_of: The type of a value of the model, or None when unknown.
        const_data: Values of constants known so far (for data-dependent shape inference).
        where: A prefix naming the block being built, for error messages.

    Returns:
        The inferred output types (empty for ops onnx has no schema for, or when an
        input type is unknown).

    Raises:
        ValueError: if the op does not exist at the model's opset, or the node is invalid.
        TypeError: if the op does not accept its inputs' types or shapes.
    """
    domain = node.domain or ""
    if domain not in ONNX_DOMAINS:
        return {}
    version = opsets.get(domain, DEFAULT_DOMAIN_VERSIONS.get(domain, 1))
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        raise InvalidValueError(
            f"{where}op '{node.op_type}' (domain '{domain or 'ai.onnx'}') does not exist at opset "
            f"{version} of the model. Check the op name, or import a newer opset."
        ) from None
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = _limits.MAX_IR_VERSION
    ctx.opset_imports = dict(opsets)
    # A subgraph (Loop, If, Scan) reads values of the model that one node's check cannot see:
    # such a node is checked with the whole model, when it is finished.
    nested = any(a.type in _GRAPH_ATTRIBUTES for a in node.attribute)
    try:
        if not nested:
            onnx.checker.check_node(node, ctx)
    except onnx.checker.ValidationError as exc:
        raise InvalidValueError(
            f"{where}node {node.name} ({node.op_type}) is invalid: {exc}"
        ) from None
    if nested:
        return {}
    input_types = {}
    input_data = {i: const_data[i] for i in node.input if i in const_data}
    for i in node.input:
        if not i:
            continue
        t = type_of(i)
        if t is None:
            return {}
        input_types[i] = t
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            schema,
            node,
            input_types,
            input_data=input_data,
            opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
        )
    except Exception as exc:
        described = ", ".join(f"'{i}': {describe_type(t)}" for i, t in input_types.items())
        raise InvalidTypeError(
            f"{where}node {node.name} ({node.op_type}) does not accept its inputs ({described}): "
            f"{str(exc).strip()}. Make the inputs' dtypes and shapes fit the op (e.g. "
            "onnxblocks.blocks.Cast "
            "for dtypes)."
        ) from None
    return {k: v for k, v in inferred.items() if v.WhichOneof("value")}


def newer_opset_needed(op_type: str, version: int | None, newer: int) -> bool:
    """True when ai.onnx's ``op_type`` does not exist at ``version`` but does at ``newer``."""
    if version is None or version >= newer or not onnx.defs.has(op_type):
        return False
    try:
        onnx.defs.get_schema(op_type, version, "")
        return False
    except onnx.defs.SchemaError:
        pass
    try:
        onnx.defs.get_schema(op_type, newer, "")
    except onnx.defs.SchemaError:
        return False
    return True


def describe_type(t: onnx.TypeProto) -> str:
    """A short text for a type: ``float[2, 'N']``."""
    if t.WhichOneof("value") == "tensor_type":
        dtype = onnx.TensorProto.DataType.Name(t.tensor_type.elem_type)
        dims = [d.dim_value or d.dim_param or "?" for d in t.tensor_type.shape.dim]
        return f"{dtype.lower()}{dims}"
    return t.WhichOneof("value") or "unknown"
