"""``flat_step_model.onnx``: the step model for the JavaScript client's fast path (docs/web.md,
"WASM speed").

ONNX Runtime's JavaScript APIs copy each input and output of a run on its own, and for a small
model that per-tensor cost is most of the step. The flat step model
(:class:`~onnxblocks.portable.flat_state.FlattenState`) takes the trainable parameters and their
optimizer state as one float32 tensor and returns them updated as one; the JS client
(``js/src/trainer.mjs``) uses it on the CPU providers when an artifact directory has it, and the
step model otherwise. Python's session binds its tensors once and keeps the step model.
"""

from __future__ import annotations

import os
from pathlib import Path

from onnxblocks._core.contracts import FLAT_STEP_MODEL, ONNX_SUFFIX, ArtifactNames
from onnxblocks._core.errors import FileMissingError
from onnxblocks._core.tempfiles import temp_path
from onnxblocks.io import load_model
from onnxblocks.ir import serde
from onnxblocks.portable.flat_state import FlattenState


def write_flat_step(directory: str | os.PathLike) -> Path:
    """Write ``flat_step_model.onnx`` beside the step model of portable artifacts.

    The file references the same external data as the step model (the frozen base of LoRA
    artifacts stays in ``base_weights.bin``, read by both). The step model is not changed.

    Args:
        directory: An artifact directory of ``generate_artifacts(..., portable=True)``.

    Returns:
        The path written.

    Raises:
        FileNotFoundError: if the directory has no ``step_model.onnx``.
        PortabilityError: if a trainable parameter or its optimizer state is not float32 or has
            no static shape (the step model still serves the client).
    """
    folder = Path(os.fspath(directory))
    step = folder / ArtifactNames().step_model
    if not step.is_file():
        raise FileMissingError(
            f"No '{step.name}' in '{folder}': write_flat_step needs portable artifacts with a "
            "fused step (generate_artifacts(..., portable=True))."
        )
    model = serde.from_proto(load_model(step), step)
    FlattenState()(model)
    target = folder / f"{FLAT_STEP_MODEL}{ONNX_SUFFIX}"
    staged = temp_path(target)
    try:
        staged.write_bytes(serde.to_proto(model).SerializeToString())
        os.replace(staged, target)
    finally:
        staged.unlink(missing_ok=True)
    return target
