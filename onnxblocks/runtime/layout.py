"""Where the training artifacts of a directory are.

An artifact directory holds ``<prefix>training_model.onnx``, ``<prefix>eval_model.onnx``,
``<prefix>optimizer_model.onnx`` and ``<prefix>checkpoint`` (the names
``onnxblocks.artifacts.generate_artifacts`` writes), and, for portable artifacts,
``<prefix>step_model.onnx`` (the fused training step). Models saved in ORT format
(``.ort``) are found too; ``.onnx`` wins when both exist. The names are the
contract of :class:`onnxblocks._core.contracts.ArtifactNames`. Portable artifacts
say so in their models' metadata (``onnxblocks.portable``; see docs/portable.md).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from onnxblocks._core.contracts import (
    BASE_DTYPE_METADATA,
    EVAL_MODEL,
    OPTIMIZER_MODEL,
    PORTABLE_METADATA,
    STEP_MODEL,
    TRAINING_MODEL,
    ArtifactNames,
)
from onnxblocks._core.errors import FileMissingError


def remove_leftovers(directory: Path) -> None:
    """Remove what killed ``generate_artifacts`` runs left in and beside ``directory`` (and roll
    back their commits).

    Readers wait at most :data:`READER_LOCK_TIMEOUT_S` for a writer holding the
    directory; the writer itself cleans up before it commits.
    """
    from onnxblocks._core.errors import LockTimeoutError
    from onnxblocks._core.leftovers import clean

    with contextlib.suppress(LockTimeoutError):
        clean(directory, lock_timeout=READER_LOCK_TIMEOUT_S)


#: How long opening an artifact directory waits for a writer's lock to remove leftovers, in seconds.
READER_LOCK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ArtifactFiles:
    """The files of one set of training artifacts.

    Attributes:
        directory: The artifact directory.
        training_model: Path of the training model (always present).
        checkpoint: Path of the checkpoint (always present).
        eval_model: Path of the eval model, or None.
        optimizer_model: Path of the optimizer model, or None.
        step_model: Path of the fused step model (portable artifacts), or None.
        base_weights: Path of the frozen base weights the models share (``base_weights.bin``), or
        None.
    """

    directory: Path
    training_model: Path
    checkpoint: Path
    eval_model: Path | None
    optimizer_model: Path | None
    step_model: Path | None = None
    base_weights: Path | None = None

    @property
    def portable(self) -> bool:
        """True for portable artifacts (the training model's metadata says ``onnxblocks.portable =
        "1"``).

        Only the model's metadata is read (no weights); ORT-format models are not portable.
        """
        return _metadata(self.training_model).get(PORTABLE_METADATA) == "1"

    @property
    def base_dtype(self) -> str | None:
        """The element type ``generate_artifacts(base_dtype=...)`` stored the frozen base in, or
        None.
        """
        return _metadata(self.training_model).get(BASE_DTYPE_METADATA)

    @classmethod
    def find(cls, directory: str | os.PathLike, prefix: str = "") -> ArtifactFiles:
        """Locate the artifacts in ``directory``.

        Raises:
            FileNotFoundError: if the directory, its training model or its checkpoint
                is missing; the message lists what the directory holds.
        """
        root = Path(directory)
        remove_leftovers(root)
        if not root.is_dir():
            raise FileMissingError(
                f"Artifact directory '{root}' does not exist. Generate artifacts first "
                "(onnxblocks.artifacts.generate_artifacts or `onnxblocks artifacts MODEL.onnx -o "
                "DIR`)."
            )
        names = ArtifactNames(prefix)
        training = _model(root, names, TRAINING_MODEL)
        checkpoint = root / names.checkpoint
        missing = [
            str(p)
            for p, ok in (
                (root / names.training_model, training is not None),
                (checkpoint, checkpoint.exists()),
            )
            if not ok
        ]
        if missing:
            present = sorted(p.name for p in root.iterdir())
            hint = f" (prefix is {prefix!r})" if prefix else ""
            raise FileMissingError(
                f"'{root}' is not a complete artifact directory{hint}: missing "
                f"{', '.join(missing)}. "
                f"It holds {present or 'nothing'}. Pass the directory generate_artifacts wrote, "
                "with its prefix."
            )
        assert training is not None
        eval_model, optimizer_model = (
            _model(root, names, EVAL_MODEL),
            _model(root, names, OPTIMIZER_MODEL),
        )
        base = root / names.base_weights
        step = _model(root, names, STEP_MODEL)
        return cls(
            root,
            training,
            checkpoint,
            eval_model,
            optimizer_model,
            step,
            base if base.is_file() else None,
        )


def _model(root: Path, names: ArtifactNames, stem: str) -> Path | None:
    """The ``.onnx`` file of a model, else its ``.ort`` file, else None."""
    for ort_format in (False, True):
        path = root / names.model(stem, ort_format)
        if path.is_file():
            return path
    return None


def _metadata(model: Path) -> dict[str, str]:
    """A model file's ``metadata_props`` (empty for ``.ort`` files)."""
    if model.suffix != ".onnx":
        return {}
    from onnxblocks.io import load_model

    proto = load_model(model)
    return {p.key: p.value for p in proto.metadata_props}
