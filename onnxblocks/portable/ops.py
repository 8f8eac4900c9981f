"""Which ops a portable model may hold, in each portable mode.

* ``"standard"`` (the default, ``portable=True``): standard ONNX ops only (the
  ``ai.onnx`` default domain and ``ai.onnx.ml``), which every ONNX runtime and
  ``onnx.reference.ReferenceEvaluator`` run.
* ``"onnxruntime"`` (opt-in, for speed): also the inference kernels stock
  ``onnxruntime`` (Python, ``onnxruntime-node``, ``onnxruntime-web``'s wasm backend)
  runs on CPU outside the standard: :data:`PORTABLE_CONTRIB_OPS` from ``com.microsoft``
  and :data:`ORT_DEFAULT_DOMAIN_OPS` (ONNX Runtime's own default-domain ops).
"""

from __future__ import annotations

import functools
from typing import Literal

import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.errors import InvalidValueError
from onnxblocks.ir.serde import from_proto
from onnxblocks.ir.walk import all_nodes, proto_nodes

#: A portable mode: ``"standard"`` (standard ONNX ops only) or ``"onnxruntime"`` (stock ONNX
#: Runtime's contrib ops too).
PortableMode = Literal["standard", "onnxruntime"]
#: The portable modes, the default first.
PORTABLE_MODES: tuple[PortableMode, ...] = ("standard", "onnxruntime")

#: ``com.microsoft`` ops that stock ONNX Runtime runs on CPU, which an ``"onnxruntime"``-mode model
#: may hold.
PORTABLE_CONTRIB_OPS = frozenset(
    {
        "FusedMatMul",
        "TransposeMatMul",
        "Gelu",
        "FastGelu",
        "BiasGelu",
        "QuickGelu",
        "FusedGemm",
        "FusedConv",
        "SkipLayerNormalization",
        "Range",
        "Trilu",
    }
)


#: ONNX Runtime's own default-domain ops that stock ONNX Runtime runs on CPU (RMSNorm, and layer
#: norm below
#: opset 17, as its graph fusions emit them), which an ``"onnxruntime"``-mode model may hold.
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization", "LayerNormalization"})


def portable_mode(mode: object, what: str = "portable") -> PortableMode:
    """The portable mode ``mode`` names: ``True`` or ``"standard"`` -> ``"standard"``,
    ``"onnxruntime"``.

    Raises:
        InvalidValueError: for anything else, naming ``what`` (the argument) and the choices.
    """
    if mode is True or mode == "standard":
        return "standard"
    if mode == "onnxruntime":
        return "onnxruntime"
    raise InvalidValueError(
        f"{what} must be True, 'standard' (standard ONNX ops only) or 'onnxruntime' (also the "
        "contrib ops stock "
        f"onnxruntime runs, for speed), not {mode!r}."
    )


@functools.lru_cache(maxsize=4096)
def is_portable_op(
    op_type: str, domain: str = "", opset: int | None = None, mode: PortableMode = "standard"
) -> bool:
    """True for an op a portable model of ``mode`` may hold.

    A standard ONNX op (at ``opset``, any opset when None) always; with ``mode="onnxruntime"``
    also a contrib op stock ONNX Runtime runs on CPU (:data:`PORTABLE_CONTRIB_OPS`,
    :data:`ORT_DEFAULT_DOMAIN_OPS`).
    """
    onnxruntime_mode = mode == "onnxruntime"
    if domain in ("", "ai.onnx"):
        if not onnx.defs.has(
            op_type, ""
        ):  # ONNX Runtime's own ops in the default domain: MaxPoolGrad...
            return onnxruntime_mode and op_type in ORT_DEFAULT_DOMAIN_OPS
        if opset is None:
            return True
        try:
            onnx.defs.get_schema(op_type, opset, "")
        except onnx.defs.SchemaError:
            return onnxruntime_mode and op_type in ORT_DEFAULT_DOMAIN_OPS
        return True
    if domain == "ai.onnx.ml":
        return onnx.defs.has(op_type, domain)
    return onnxruntime_mode and domain == _limits.MS_DOMAIN and op_type in PORTABLE_CONTRIB_OPS


def non_portable_ops(
    model: onnx.ModelProto | ir.Model, mode: PortableMode | bool = "standard"
) -> list[tuple[ir.Node, str, str]]:
    """Nodes of ``model`` (subgraphs included) that a portable model of ``mode`` may not hold.

    Args:
        model: The model.
        mode: ``"standard"`` (default, also ``True``): anything but a standard ONNX op;
            ``"onnxruntime"``: anything stock ONNX Runtime cannot run on CPU.

    Returns:
        ``(node, op_type, domain)`` of each such node (an ``onnx_ir`` node), in graph order;
        empty for a portable model.

    Raises:
        InvalidValueError: for an unknown ``mode``.
    """
    checked = portable_mode(mode, "mode")
    if isinstance(model, onnx.ModelProto):
        # A portable model (the usual answer) is seen on the protobuf without building its IR;
        # the IR, whose nodes are returned, is built only when there is something to report.
        imports = {o.domain: o.version for o in model.opset_import}
        at = imports.get("", imports.get("ai.onnx"))
        if all(
            is_portable_op(n.op_type, n.domain or "", at, checked) for n in proto_nodes(model.graph)
        ):
            return []
        model = from_proto(model)
    graph = model.graph
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx"))
    return [
        (n, n.op_type, n.domain or "ai.onnx")
        for n in all_nodes(graph)
        if not is_portable_op(n.op_type, n.domain, opset, checked)
    ]
