"""``com.microsoft`` inference ops with a plain standard form: ``Range``, ``FusedGemm``,
``FusedConv``.

Stock ONNX Runtime runs them on CPU, so an ``"onnxruntime"``-mode model keeps them;
in ``"standard"`` mode they become the standard op they fuse, followed by the
activation (``FusedConv`` adds its ``Z`` input first, as ONNX Runtime's kernel does).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from onnxblocks.portable.lowering_context import (
    LoweringContext,
    Writer,
    attributes,
    inputs,
    outputs,
    unsupported,
)

#: The activations of ``FusedGemm`` / ``FusedConv`` and the names of their ``activation_params``.
_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "LeakyRelu": ("alpha",),
    "HardSigmoid": ("alpha", "beta"),
}


def contrib_range(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``com.microsoft:Range(start, limit[, delta=1])`` as the standard ``Range`` (opset 11)."""
    start, limit, delta = inputs(node, 3)
    ctx.require_opset(node, 11, "Range")
    w = ctx.writer(node)
    if delta is None:
        delta = w.scalar(1, ctx.elem_type(start) or 7)
    w.op("Range", [start, limit, delta], outputs(node, 1)[0])
    return w.nodes


def _activate(node: ir.Node, w: Writer, x: ir.Value, out: str) -> None:
    """Apply ``node``'s ``activation`` (with its ``activation_params``) to ``x``, writing
    ``out``.
    """
    kind = node.attributes.get_string("activation", "")
    if kind not in _ACTIVATIONS:
        raise unsupported(node, f"activation {kind!r}")
    names = _ACTIVATIONS[kind]
    params = list(node.attributes.get_floats("activation_params", []) or [])  # FusedConv's form
    gemm_form = [node.attributes.get_float(f"activation_{n}", None) for n in names]  # FusedGemm's
    if not params and all(p is not None for p in gemm_form):
        params = [float(p) for p in gemm_form if p is not None]
    if len(params) not in (0, len(names)):
        raise unsupported(node, f"activation {kind!r} with {len(params)} activation_params")
    attrs: dict[str, Any] = dict(zip(names, params, strict=False))
    w.ops(kind, [x], [out], **attrs)


def fused_gemm(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``FusedGemm(A, B[, C])``: ``Gemm`` (its ``alpha``, ``beta``, ``transA``, ``transB``), then
    the activation.
    """
    w = ctx.writer(node)
    product = w.op(
        "Gemm", list(node.inputs), None, **attributes(node, "alpha", "beta", "transA", "transB")
    )
    _activate(node, w, product, outputs(node, 1)[0])
    return w.nodes


def fused_conv(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``FusedConv(X, W[, B][, Z])``: ``Conv``, plus ``Z`` when given, then the activation."""
    x, weight, bias, z = inputs(node, 4)
    w = ctx.writer(node)
    conv_attrs = attributes(
        node, "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"
    )
    out = w.op("Conv", [x, weight, *([bias] if bias is not None else [])], None, **conv_attrs)
    if z is not None:
        out = w.op("Add", [out, z])
    _activate(node, w, out, outputs(node, 1)[0])
    return w.nodes


LOWERINGS = {
    "Range": contrib_range,
    "FusedGemm": fused_gemm,
    "FusedConv": fused_conv,
}
