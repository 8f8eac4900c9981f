"""Converting a model's ai.onnx opset with onnx's version converter, naming what blocks it.

The limits themselves (the highest opset the installed runtime implements, the IR
version each opset needs) are data in :mod:`onnxblocks._core.limits`; converting
reads every node, subgraphs included, so it sits on the IR layer's walk.
"""

from __future__ import annotations

import logging
import re

import onnx
from onnx import version_converter

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import InvalidValueError

logger = logging.getLogger(__name__)


def convert_opset(
    model: onnx.ModelProto, target: int, what: str = "the base model"
) -> onnx.ModelProto:
    """A copy of ``model`` converted to ai.onnx opset ``target`` with onnx's version converter.

    Raises:
        ValueError: naming the ops that have no definition at ``target`` (or that the
            converter cannot adapt), when the conversion is impossible.
    """
    from onnxblocks.ir.walk import proto_nodes  # onnx_ir is loaded only when a model is converted

    current = _limits.onnx_opset(model)
    default_domain = (n.op_type for n in proto_nodes(model.graph) if n.domain in ("", "ai.onnx"))
    blocking = sorted({op for op in default_domain if not _defined_at(op, target)})
    if blocking:
        raise InvalidValueError(
            f"{what} imports ai.onnx opset {current}; it cannot be converted to opset {target}, "
            "because these ops "
            f"do not exist there: {', '.join(blocking)}. Re-export the model with "
            f"opset_version={target} (or write "
            "those ops with older ones)."
        )
    try:
        converted = _unhide(version_converter.convert_version(_hide_unknown(model), target))
    except Exception as exc:
        reason = _converter_reason(exc)
        ops = sorted(
            {op for op in re.findall(r"\b([A-Z][A-Za-z0-9]+)\b", reason) if onnx.defs.has(op)}
        )
        named = f" (blocked by {', '.join(ops)})" if ops else ""
        raise InvalidValueError(
            f"{what} imports ai.onnx opset {current}; onnx's version converter could not convert "
            "it to opset "
            f"{target}{named}: {reason}. Re-export the model with opset_version={target}."
        ) from None
    logger.info(
        "Converted %s from ai.onnx opset %s to %s with onnx's version converter.",
        what,
        current,
        target,
    )
    return converted


def fit_opset(model: onnx.ModelProto, what: str = "the base model") -> onnx.ModelProto:
    """``model`` itself if the installed runtime implements its opset, else a copy converted down to
    it.

    Raises:
        ValueError: if the model has no ai.onnx opset import, or cannot be converted
            (naming the ops that block it).
    """
    _limits.check_opset_import(model, what)
    version = _limits.onnx_opset(model)
    if version is None or version <= _limits.MAX_ONNX_OPSET:
        return model
    return convert_opset(model, _limits.MAX_ONNX_OPSET, what)


#: The domain ops of the default domain that onnx has no schema for (ONNX Runtime's fusions, such as
#: ``SimplifiedLayerNormalization``) pass the version converter in, unchanged.
_PASSING = "onnxblocks.opset.passing"


def _hide_unknown(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy whose default-domain ops onnx has no schema for are in ``_PASSING``."""
    from onnxblocks.ir.walk import proto_nodes

    def unknown(node: onnx.NodeProto) -> bool:
        return node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type)

    if not any(unknown(n) for n in proto_nodes(model.graph)):
        return model
    hidden = onnx.ModelProto()
    hidden.CopyFrom(model)
    for node in proto_nodes(hidden.graph):
        if unknown(node):
            node.domain = _PASSING
    hidden.opset_import.append(onnx.helper.make_opsetid(_PASSING, 1))
    return hidden


def _unhide(model: onnx.ModelProto) -> onnx.ModelProto:
    """Undo :func:`_hide_unknown` on the converted model (in place)."""
    from onnxblocks.ir.walk import proto_nodes

    for node in proto_nodes(model.graph):
        if node.domain == _PASSING:
            node.domain = ""
    kept = [o for o in model.opset_import if o.domain != _PASSING]
    if len(kept) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return model


def _defined_at(op_type: str, version: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return not onnx.defs.has(op_type)  # an op onnx does not know: not ours to judge
    return True


def _converter_reason(exc: BaseException) -> str:
    """The version converter's message without its C++ file, line and assertion text."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\S+\.(?:h|cc|cpp):\d+:\s*\w*:?\s*", "", text)
    return re.sub(r"^Assertion `[^`]*` failed:\s*", "", text).rstrip(".")
