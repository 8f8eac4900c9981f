"""What the installed ONNX Runtime accepts, and stamping models so it loads them.

onnx 1.23 writes IR version 14 by default, but onnxruntime-training 1.19.2 loads
IR <= 10 and default-domain opsets <= 21. Every model onnxblocks emits goes
through :func:`stamp_versions`.
"""

from __future__ import annotations

import onnx

#: Highest IR version onnxruntime-training 1.19.2 loads.
MAX_IR_VERSION = 10
#: Highest default-domain (``ai.onnx``) opset onnxruntime-training 1.19.2 implements.
MAX_ONNX_OPSET = 21
#: Default opset for models built from scratch.
DEFAULT_ONNX_OPSET = 17
#: Version of the ``com.microsoft`` contrib domain.
MS_DOMAIN = "com.microsoft"
MS_OPSET = 1

# IR version each default-domain opset needs (onnx's own table, capped).
_IR_FOR_OPSET = {
    **{v: 7 for v in range(1, 13)},
    13: 7,
    14: 7,
    15: 8,
    16: 8,
    17: 8,
    18: 8,
    19: 9,
    20: 9,
    21: 10,
}


def onnx_opset(model: onnx.ModelProto) -> int | None:
    """Return the default-domain opset a model imports, or None if it imports none."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    return None


def check_opset_supported(model: onnx.ModelProto, what: str = "the base model") -> None:
    """Raise a clear error when a model needs a newer runtime than the installed one.

    Raises:
        ValueError: if the default-domain opset is above :data:`MAX_ONNX_OPSET`.
    """
    version = onnx_opset(model)
    if version is not None and version > MAX_ONNX_OPSET:
        raise ValueError(
            f"{what} imports ai.onnx opset {version}, but onnxruntime-training 1.19.2 supports opsets "
            f"up to {MAX_ONNX_OPSET}. Convert it first, e.g. "
            f"onnx.version_converter.convert_version(model, {MAX_ONNX_OPSET}), or re-export it with "
            f"opset_version={MAX_ONNX_OPSET}."
        )


def ensure_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    """Import ``domain`` at ``version`` in ``model`` unless it already imports that domain."""
    names = {"ai.onnx": ""}
    domain = names.get(domain, domain)
    for opset in model.opset_import:
        if names.get(opset.domain, opset.domain) == domain:
            return
    model.opset_import.append(onnx.helper.make_opsetid(domain, version))


def stamp_versions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Set the IR version to one the installed runtime loads, in place; returns ``model``.

    The IR version is the lowest that the model's default opset needs, and never
    above :data:`MAX_IR_VERSION`.
    """
    check_opset_supported(model, "the model")
    opset = onnx_opset(model) or DEFAULT_ONNX_OPSET
    needed = _IR_FOR_OPSET.get(opset, MAX_IR_VERSION)
    current = model.ir_version or 0
    model.ir_version = min(max(current, needed), MAX_IR_VERSION) if current <= MAX_IR_VERSION else MAX_IR_VERSION
    return model
