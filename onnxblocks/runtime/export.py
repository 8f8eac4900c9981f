"""Exporting an inference model from a training session's eval model and current parameters."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from onnxblocks._core.contracts import FORWARD_OUTPUTS_METADATA
from onnxblocks.io import atomic_file
from onnxblocks.runtime import _ort


def export_inference(module: Any, destination: Path, names: Sequence[str], eval_outputs: Sequence[str]) -> Path:
    """Write the inference model that ONNX Runtime's training ``Module`` cuts from its eval model.

    Args:
        module: The ONNX Runtime training ``Module`` (its parameters are the trained ones).
        destination: The ``.onnx`` file, written atomically.
        names: The outputs to keep.
        eval_outputs: The eval model's outputs, for the error message.

    Returns:
        ``destination``.

    Raises:
        ValueError: if ``names`` is empty or ONNX Runtime rejects them.
    """
    names = list(names)
    if not names:
        raise ValueError(
            "export_inference_model: cannot tell which outputs the inference model should have. Pass "
            "output_names=[...] (e.g. the forward model's outputs), or generate the artifacts with "
            "additional_output_names=[...]."
        )
    destination.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(destination) as temp:
        try:
            module.export_model_for_inferencing(os.fspath(temp), names)
        except RuntimeError as exc:
            raise ValueError(
                f"Cannot export outputs {names}: {_ort.clean_message(exc)}. Eval model outputs: {list(eval_outputs)}."
            ) from None
    return destination


def forward_outputs_hint(eval_model: Path | None) -> list[str]:
    """Forward output names recorded in the eval model's metadata (``onnxblocks.forward_outputs``), if any.

    The value is a JSON list of names, or a comma-separated list.
    """
    if eval_model is None or eval_model.suffix != ".onnx":
        return []
    model = onnx.load(os.fspath(eval_model), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == FORWARD_OUTPUTS_METADATA:
            try:
                names = json.loads(prop.value)
            except ValueError:
                names = [n for n in prop.value.split(",") if n]
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return names
    return []
