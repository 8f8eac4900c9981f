"""ArtifactSet: the files of one artifact directory, each read once and checked once.

Opening a :class:`~onnxblocks.runtime.session.TrainingSession` needs several things
of each file before ONNX Runtime sees it: the training model's metadata (portable or
not, LoRA), the inputs of the training and eval models (batch checks), their nodes
(index guards), the parameters every model takes (do they fit the checkpoint?), the
checkpoint's metadata (is the file sound?) and values (the portable backend's buffers,
the weight average, the optimizer state). :meth:`ArtifactSet.read` reads each file
once, into:

* one :class:`ModelFile` per model: its structure (nodes, inputs, outputs, metadata
  and small initializers; initializers of
  :data:`~onnxblocks.runtime.signature.SKIP_BYTES` bytes or more are not read), from
  which its signature, input specs and metadata are derived;
* one :class:`CheckpointRead`: the checkpoint's metadata and values from one mapping
  of the file (inline tensors are views of it, nothing is copied until used).

and checks once that they fit: the checkpoint on its own and against the training
model (:func:`onnxblocks.checkpoint.validate.read_checked`), then every model against
the checkpoint and the others (:func:`onnxblocks.runtime.consistency.check_artifact_set`:
names, element types, shapes, optimizer slots). The guards and the backends take the
set instead of paths. ONNX Runtime still opens the model files itself, by path (so
that external data resolves next to them).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from onnxblocks._core.contracts import BASE_DTYPE_METADATA, LORA_METADATA, PORTABLE_METADATA
from onnxblocks._core.errors import FileMissingError
from onnxblocks._core.weights import load_structure
from onnxblocks.checkpoint import Checkpoint
from onnxblocks.checkpoint.format import ParsedCheckpoint, dtype_of
from onnxblocks.checkpoint.save import EXTRA_PREFIX
from onnxblocks.checkpoint.validate import read_checked
from onnxblocks.runtime.consistency import check_artifact_set
from onnxblocks.runtime.inputs import InputSpec, specs_from_value_infos
from onnxblocks.runtime.layout import ArtifactFiles
from onnxblocks.runtime.signature import (
    SKIP_BYTES,
    Signature,
    Spec,
    check_external_data,
    signature_of,
)

if TYPE_CHECKING:
    from onnxblocks.peft.info import LoraInfo


@dataclass(frozen=True)
class ModelFile:
    """One model file of an artifact set, read once.

    Attributes:
        path: The file.
        what: ``"training model"``, ``"eval model"``...: for messages.
        model: Its structure (initializers of 256 bytes or more left unread), or None for an
            ORT-format (``.ort``) file, which onnx cannot read.
    """

    path: Path
    what: str
    model: onnx.ModelProto | None

    @classmethod
    def read(cls, path: Path, what: str) -> ModelFile:
        """Read ``path`` (an ``.ort`` file is not read).

        Raises:
            FileNotFoundError: if the file is missing.
            ValueError: if it is not an ONNX model.
        """
        if path.suffix != ".onnx":
            return cls(path, what, None)
        try:
            model = load_structure(path, SKIP_BYTES)
        except (OSError, MemoryError):
            raise
        except Exception:  # load_model words the failure (decoding, external data) for users
            from onnxblocks.io import load_model

            load_model(path)
            raise
        return cls(path, what, model)

    @functools.cached_property
    def metadata(self) -> dict[str, str]:
        """The model's ``metadata_props`` (empty for ``.ort`` files)."""
        if self.model is None:
            return {}
        return {p.key: p.value for p in self.model.metadata_props}

    @functools.cached_property
    def signature(self) -> Signature | None:
        """Its graph inputs and outputs (None for ``.ort`` files), after checking its external
        data references.
        """
        if self.model is None:
            return None
        check_external_data(self.path, self.model.graph, self.what)
        return signature_of(self.path, self.what, self.model.graph)

    def input_specs(self, names: Sequence[str]) -> list[InputSpec]:
        """The specs of the graph inputs ``names`` (unknown dtype and shape for ``.ort``)."""
        if self.model is None:
            return [InputSpec(n, None, None) for n in names]
        specs = specs_from_value_infos(self.model.graph.input)
        return [specs.get(n, InputSpec(n, None, None)) for n in names]


@dataclass(frozen=True)
class CheckpointRead:
    """One checkpoint file, read and checked once.

    Attributes:
        path: The checkpoint.
        parsed: Its metadata.
        values: Its contents (inline tensors are read-only views of the mapped file); None
            once the backend has taken them (:meth:`ArtifactSet.released`).
    """

    path: Path
    parsed: ParsedCheckpoint
    values: Checkpoint | None

    @property
    def params(self) -> dict[str, Spec]:
        """Every model parameter (no extras): name -> (numpy dtype, dims; None when nominal)."""
        where = f"checkpoint '{self.path}'"
        return {
            e.name: (dtype_of(e, where), None if self.parsed.is_nominal else tuple(e.dims))
            for e in (*self.parsed.trainable, *self.parsed.frozen)
            if not e.name.startswith(EXTRA_PREFIX)
        }

    @property
    def trainable(self) -> list[str]:
        """The trainable parameters, in file order."""
        return [e.name for e in self.parsed.trainable]

    def contents(self) -> Checkpoint:
        """The values, while the set holds them."""
        assert self.values is not None, "the checkpoint's values were released"
        return self.values


@dataclass(frozen=True)
class ArtifactSet:
    """The files of one artifact directory, read once and checked to fit (see the module
    docstring).

    Attributes:
        files: Where the files are.
        training: The training model.
        eval: The eval model, or None.
        optimizer: The optimizer model, or None.
        step: The fused step model (portable artifacts), or None.
        checkpoint: The checkpoint the session starts from.
    """

    files: ArtifactFiles
    training: ModelFile
    eval: ModelFile | None
    optimizer: ModelFile | None
    step: ModelFile | None
    checkpoint: CheckpointRead

    @classmethod
    def read(
        cls,
        directory: str | os.PathLike,
        prefix: str = "",
        checkpoint: str | os.PathLike | None = None,
    ) -> ArtifactSet:
        """Read and check the artifacts of ``directory``, starting from ``checkpoint`` (default
        the directory's own).

        Raises:
            FileNotFoundError: if the directory, training model or checkpoint is missing.
            onnxblocks.errors.CheckpointFormatError: for a checkpoint that is not sound.
            onnxblocks.errors.CheckpointMismatchError: for a checkpoint of other models.
            InvalidValueError: for models that do not fit each other.
        """
        files = ArtifactFiles.find(directory, prefix)
        return cls.of(files, Path(checkpoint) if checkpoint is not None else files.checkpoint)

    @classmethod
    def of(cls, files: ArtifactFiles, checkpoint: Path) -> ArtifactSet:
        """The set of ``files``, starting from ``checkpoint`` (see :meth:`read`)."""
        training = ModelFile.read(files.training_model, "training model")
        read = _read_checkpoint(checkpoint, training)

        def model(path: Path | None, what: str) -> ModelFile | None:
            return None if path is None else ModelFile.read(path, what)

        found = cls(
            files,
            training,
            model(files.eval_model, "eval model"),
            model(files.optimizer_model, "optimizer model"),
            model(files.step_model, "step model"),
            read,
        )
        found._check()
        return found

    def with_checkpoint(self, checkpoint: Path) -> ArtifactSet:
        """The same models with another checkpoint, read and checked (the models are not read
        again).
        """
        found = dataclasses.replace(self, checkpoint=_read_checkpoint(checkpoint, self.training))
        found._check()
        return found

    def released(self) -> ArtifactSet:
        """The set without the checkpoint's values (the backend holds its own copies)."""
        return dataclasses.replace(
            self, checkpoint=dataclasses.replace(self.checkpoint, values=None)
        )

    def _check(self) -> None:
        by_path = {m.path: m for m in self.models()}
        ck = self.checkpoint

        def signature(path: Path | None, what: str) -> Signature | None:
            return None if path is None else by_path[path].signature

        check_artifact_set(
            self.files, ck.params, ck.trainable, ck.path, self.portable, read=signature
        )

    def models(self) -> list[ModelFile]:
        """The model files of the set, the training model first."""
        found = (self.training, self.eval, self.optimizer, self.step)
        return [m for m in found if m is not None]

    @property
    def portable(self) -> bool:
        """True for portable artifacts (the training model's metadata says so)."""
        return self.training.metadata.get(PORTABLE_METADATA) == "1"

    @property
    def base_dtype(self) -> str | None:
        """The element type the frozen base is stored in (``generate_artifacts(base_dtype=...)``),
        or None.
        """
        return self.training.metadata.get(BASE_DTYPE_METADATA)

    @functools.cached_property
    def lora(self) -> LoraInfo | None:
        """The LoRA record of the set (``onnxblocks.lora`` in its training or eval model), or
        None.
        """
        from onnxblocks.peft.info import LoraInfo

        for model in (self.training, self.eval):
            text = model.metadata.get(LORA_METADATA) if model is not None else None
            if text is not None:
                return LoraInfo.from_json(text)
        return None


def _read_checkpoint(path: Path, training: ModelFile) -> CheckpointRead:
    if not path.exists():
        raise FileMissingError(
            f"Checkpoint '{path}' does not exist. Pass a file written by "
            "TrainingSession.save_checkpoint or generate_artifacts."
        )
    # before ONNX Runtime sees it: a bad one can crash it
    name = f"the model '{training.path.name}'"
    parsed, values = read_checked(path, training.model, name)
    return CheckpointRead(path, parsed, values)
