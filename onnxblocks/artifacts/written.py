"""Artifacts: what :func:`~onnxblocks.artifacts.generate_artifacts` wrote, by role."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from onnxblocks._core.html import HtmlDisplay

__all__ = ["Artifacts"]


@dataclass(frozen=True)
class Artifacts(HtmlDisplay):
    """What :func:`generate_artifacts` wrote.

    Attributes:
        directory: The artifact directory.
        training_model: Path of the training model.
        eval_model: Path of the eval model.
        checkpoint: Path of the checkpoint.
        optimizer_model: Path of the optimizer model, or None without an optimizer.
        nominal_checkpoint: Path of the nominal checkpoint, or None.
        training_model_ort, eval_model_ort, optimizer_model_ort: ORT-format copies, or None.
        requires_grad: Names of the trainable parameters, in input order.
        frozen_params: Names of the frozen parameters, in input order.
        input_names: The user inputs of the training and eval models.
        output_names: The user outputs (the loss first).
        files: Every file written, external data files included.
        step_model: Path of the fused step model of portable artifacts (docs/portable.md), or None.
        base_weights: Path of the base weights the models share (``base_weights.bin``), or None.
    """

    directory: Path
    training_model: Path
    eval_model: Path
    checkpoint: Path
    optimizer_model: Path | None
    nominal_checkpoint: Path | None
    training_model_ort: Path | None
    eval_model_ort: Path | None
    optimizer_model_ort: Path | None
    requires_grad: tuple[str, ...]
    frozen_params: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    files: tuple[Path, ...]
    step_model: Path | None = None
    base_weights: Path | None = None

    @property
    def loss_name(self) -> str:
        """Name of the loss output."""
        return self.output_names[0]
