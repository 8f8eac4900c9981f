"""What a :class:`~onnxblocks.runtime.session.TrainingSession` asks of the engine that runs its
artifacts.

Two engines implement :class:`Backend`:

* ``"training"`` (:mod:`onnxblocks.runtime.backend_training`): ONNX Runtime's
  training API in the training build (``onnxruntime-training``, Python <= 3.12),
  for the artifacts ``generate_artifacts`` writes by default;
* ``"portable"`` (:mod:`onnxblocks.runtime.backend_portable`): plain
  ``InferenceSession`` objects of any onnxruntime, stock included, for portable
  artifacts (``generate_artifacts(..., portable=True)``, see docs/portable.md).

:func:`select_backend` picks one for an artifact directory. The session keeps
what both share (input checks, the step counter, property encoding, atomic
saves, the inference-output defaults) and calls the backend for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.runtime import _ort
from onnxblocks.runtime.layout import ArtifactFiles

if TYPE_CHECKING:
    from onnxblocks.runtime.artifact_set import CheckpointRead

BackendName = Literal["training", "portable"]
#: What ``TrainingSession(backend=...)`` accepts.
BACKEND_CHOICES = ("auto", "training", "portable")


class Backend(Protocol):
    """The engine behind a training session (see the module docstring)."""

    #: ``"training"`` or ``"portable"``.
    name: BackendName
    train_inputs: list[str]
    train_outputs: list[str]
    eval_inputs: list[str]
    eval_outputs: list[str]
    has_optimizer: bool
    #: True when a fused step model makes :meth:`step` one run.
    has_fused_step: bool

    def train_step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]: ...

    def eval_step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]: ...

    def optimizer_step(self) -> None: ...

    def lazy_reset_grad(self) -> None: ...

    def step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """Train step, optimizer step and gradient reset on one batch (no gradients pending)."""
        ...

    def get_learning_rate(self) -> float: ...

    def set_learning_rate(self, value: float) -> None: ...

    def parameter_names(self) -> list[str]:
        """All parameter names, sorted."""
        ...

    def has_parameter(self, name: str) -> bool: ...

    def is_trainable(self, name: str) -> bool: ...

    def get_parameter(self, name: str) -> np.ndarray:
        """A copy of the parameter's value."""
        ...

    def parameter_spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]: ...

    def write_parameters(self, values: dict[str, np.ndarray]) -> None:
        """Overwrite parameters with arrays already checked against :meth:`parameter_spec`."""
        ...

    def gradient(self, name: str) -> np.ndarray | None:
        """A copy of a trainable parameter's accumulated gradient, or None when there is none
        yet.
        """
        ...

    def write_gradients(self, values: dict[str, np.ndarray]) -> None:
        """Overwrite accumulated gradients (pending ones) with arrays already checked against
        :meth:`parameter_spec`.
        """
        ...

    def num_parameters(self) -> int: ...

    def properties(self) -> dict[str, int | float | str]:
        """The stored properties, as the checkpoint holds them (int, float32 or str)."""
        ...

    def set_property(self, name: str, value: int | float | str) -> None: ...

    def save(self, path: Path, include_optimizer_state: bool) -> None:
        """Write the checkpoint file ``path`` (and its ``.data`` companion when large)."""
        ...

    def load(self, checkpoint: CheckpointRead) -> None:
        """Replace parameters, optimizer state and properties with those of a checkpoint read
        (and checked against the models) by the session's
        :class:`~onnxblocks.runtime.artifact_set.ArtifactSet`.
        """
        ...


def select_backend(
    requested: str, files: ArtifactFiles, portable: bool | None = None
) -> BackendName:
    """The backend to run ``files`` with (``portable``: whether they are, when already read).

    ``"auto"`` runs portable artifacts on the portable backend (on any
    onnxruntime) and other artifacts on the training build.

    Raises:
        ValueError: for an unknown name, or artifacts the asked backend cannot run.
        TrainingBuildRequiredError: for non-portable artifacts on stock onnxruntime.
    """
    if requested not in BACKEND_CHOICES:
        raise InvalidValueError(f"backend must be one of {BACKEND_CHOICES}, got {requested!r}.")
    if portable is None:
        portable = files.portable
    if portable:
        if requested == "training":
            raise InvalidValueError(
                f"The artifacts in '{files.directory}' are portable (standard ops, explicit "
                "gradient accumulation): "
                "they run on the portable backend only. Use backend='portable' or 'auto', or "
                "generate the artifacts "
                "without portable=True for the training build."
            )
        return "portable"
    if requested == "portable":
        raise InvalidValueError(
            f"The artifacts in '{files.directory}' are not portable: their training and "
            "optimizer models use ONNX "
            "Runtime's training kernels. Regenerate them with generate_artifacts(..., "
            "portable=True) (or "
            "`onnxblocks artifacts ... --portable`) to train on stock onnxruntime, or use "
            "backend='training'."
        )
    _ort.require_training_build(
        f"Training the artifacts in '{files.directory}' (they are not portable)"
    )  # the clear error on stock onnxruntime
    return "training"
