"""The training state file shared with the JavaScript client: parameters and optimizer state in safetensors.

JavaScript cannot read ONNX Runtime's checkpoint (a flatbuffer of TensorProtos)
without a protobuf and a flatbuffers library; a safetensors file needs neither.
So the web side reads and writes ``params.safetensors`` (docs/web.md), and Python
converts between it and checkpoints:

* :func:`write_state`: checkpoint (or artifact directory) -> ``params.safetensors``;
* :func:`read_state`: ``params.safetensors`` -> :class:`WebState`;
* :func:`state_to_checkpoint`: ``params.safetensors`` -> an ONNX Runtime checkpoint with the
  optimizer state, laid out as ONNX Runtime's ``save_checkpoint`` lays it out, to resume
  with ``TrainingSession(artifacts, checkpoint=...)``;
* :func:`load_state`: the parameters into a live :class:`~onnxblocks.runtime.TrainingSession`.

The file holds every parameter by name; AdamW's moments as ``<p>.exp_avg`` and
``<p>.exp_avg_sq`` (the fused step model's input names); and in ``__metadata__``:
``format`` (``"onnxblocks-web/1"``), ``trainable`` and ``frozen`` (JSON lists),
``step`` (optimizer steps taken), ``learning_rate`` (JSON number) and
``properties`` (the checkpoint's property bag, JSON ``{name: [kind, value]}``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.contracts import DEFAULT_LEARNING_RATE, OPTIMIZER_GROUP, ArtifactNames, moment_names
from onnxblocks._core.errors import FileMissingError, InvalidValueError
from onnxblocks.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from onnxblocks.runtime.session import STEP_PROPERTY
from onnxblocks.web.safetensors import read_safetensors, write_safetensors

#: The state file's name inside an artifact directory.
STATE_FILE = "params.safetensors"
#: ``__metadata__["format"]`` of state files.
STATE_FORMAT = "onnxblocks-web/1"
_KINDS: dict[str, type] = {"int": int, "float": float, "str": str}


@dataclass
class WebState:
    """Parameters and optimizer state, as the state file holds them.

    Attributes:
        trainable: Trainable parameters by name, in order.
        frozen: Frozen parameters by name.
        moments: Per trainable parameter, its optimizer moments (AdamW: ``[exp_avg, exp_avg_sq]``;
            empty for SGD or before the first step).
        step: Optimizer steps taken.
        learning_rate: The learning rate saved with the state (None: not recorded).
        properties: The checkpoint's property bag.
    """

    trainable: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray]
    moments: dict[str, list[np.ndarray]] = field(default_factory=dict)
    step: int = 0
    learning_rate: float | None = None
    properties: dict[str, int | float | str] = field(default_factory=dict)

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        """Trainable and frozen parameters together."""
        return {**self.trainable, **self.frozen}

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> WebState:
        """The state of a loaded checkpoint (ONNX Runtime's optimizer group ``group0``, if it has one)."""
        if checkpoint.is_nominal:
            raise InvalidValueError(
                "A nominal checkpoint holds no parameter values; generate the artifacts with "
                "nominal_checkpoint=False for the web."
            )
        group = checkpoint.optimizer_state.get(OPTIMIZER_GROUP) or next(iter(checkpoint.optimizer_state.values()), None)
        return cls(
            trainable=dict(checkpoint.trainable),
            frozen=dict(checkpoint.frozen),
            moments={k: list(v) for k, v in (group or {}).get("moments", {}).items() if len(v)},
            step=int(group["step"]) if group else 0,
            learning_rate=float(group["initial_learning_rate"]) if group else None,
            properties=dict(checkpoint.properties),
        )


def _checkpoint_path(source: str | os.PathLike) -> Path:
    path = Path(os.fspath(source))
    return path / ArtifactNames().checkpoint if path.is_dir() else path


def write_state(source: str | os.PathLike | Checkpoint | WebState, path: str | os.PathLike | None = None) -> Path:
    """Write the state file from a checkpoint, for the JavaScript client.

    Args:
        source: An artifact directory (its ``checkpoint`` is read), a checkpoint file,
            a loaded :class:`~onnxblocks.checkpoint.Checkpoint` or a :class:`WebState`.
        path: The file to write; default ``params.safetensors`` beside the checkpoint
            (required when ``source`` is not a path).

    Returns:
        The path written.

    Raises:
        FileNotFoundError: if the checkpoint does not exist.
        ValueError: for a nominal checkpoint, or a missing ``path``.
        TypeError: for a parameter dtype the web format does not support.
    """
    if isinstance(source, (Checkpoint, WebState)):
        if path is None:
            raise InvalidValueError("write_state: pass `path` when the source is not a file or directory.")
        state = source if isinstance(source, WebState) else WebState.from_checkpoint(source)
    else:
        checkpoint = _checkpoint_path(source)
        if not checkpoint.exists():
            raise FileMissingError(
                f"No checkpoint at '{checkpoint}'. Pass an artifact directory or a checkpoint written by "
                "generate_artifacts or TrainingSession.save_checkpoint."
            )
        state = WebState.from_checkpoint(load_checkpoint(checkpoint))
        path = checkpoint.with_name(STATE_FILE) if path is None else path
    tensors: dict[str, np.ndarray] = {**state.trainable, **state.frozen}
    for name, moments in state.moments.items():
        if name not in state.trainable:
            raise InvalidValueError(f"write_state: moments given for '{name}', which is not a trainable parameter.")
        if len(moments) not in (0, 2):
            raise InvalidValueError(
                f"write_state: '{name}' has {len(moments)} optimizer moments; the web format holds AdamW's two."
            )
        tensors.update(zip(moment_names(name), moments, strict=False))  # none or both, checked above
    metadata = {
        "format": STATE_FORMAT,
        "trainable": json.dumps(list(state.trainable)),
        "frozen": json.dumps(list(state.frozen)),
        "step": str(int(state.step)),
        "properties": json.dumps({k: [type(v).__name__, v] for k, v in state.properties.items()}),
    }
    if state.learning_rate is not None:
        metadata["learning_rate"] = json.dumps(float(state.learning_rate))
    return write_safetensors(path, tensors, metadata)


def read_state(path: str | os.PathLike) -> WebState:
    """Read a state file (written by :func:`write_state` or by the JavaScript client).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it is not a state file of this format, or is inconsistent.
    """
    target = Path(os.fspath(path))
    tensors, metadata = read_safetensors(target)
    if metadata.get("format") != STATE_FORMAT:
        raise InvalidValueError(
            f"'{target}' is not an onnxblocks web state file (__metadata__ format is {metadata.get('format')!r}, "
            f"expected {STATE_FORMAT!r}). Write one with onnxblocks.web.write_state."
        )
    trainable, frozen = _names(metadata, "trainable", target), _names(metadata, "frozen", target)
    missing = [n for n in (*trainable, *frozen) if n not in tensors]
    if missing:
        raise InvalidValueError(f"'{target}': parameters {missing[:5]} are listed in the metadata but have no tensor.")
    moments: dict[str, list[np.ndarray]] = {}
    for name in trainable:
        present = [m for m in moment_names(name) if m in tensors]
        if len(present) == 1:
            raise InvalidValueError(f"'{target}': '{name}' has only one of its two moments ({present[0]}).")
        if present:
            moments[name] = [tensors[m] for m in moment_names(name)]
            for moment, value in zip(moment_names(name), moments[name], strict=True):
                if value.shape != tensors[name].shape or value.dtype != tensors[name].dtype:
                    raise InvalidValueError(
                        f"'{target}': moment '{moment}' is {value.dtype} {value.shape}, its parameter "
                        f"{tensors[name].dtype} {tensors[name].shape}."
                    )
    try:
        step = int(metadata.get("step", "0"))
        learning_rate = float(json.loads(metadata["learning_rate"])) if "learning_rate" in metadata else None
        properties = {k: _KINDS[kind](v) for k, (kind, v) in json.loads(metadata.get("properties", "{}")).items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidValueError(f"'{target}': malformed step, learning_rate or properties metadata ({exc}).") from None
    if step < 0:
        raise InvalidValueError(f"'{target}': step {step} is negative.")
    return WebState(
        trainable={n: tensors[n] for n in trainable},
        frozen={n: tensors[n] for n in frozen},
        moments=moments,
        step=step,
        learning_rate=learning_rate,
        properties=properties,
    )


def _names(metadata: dict[str, str], key: str, target: Path) -> list[str]:
    try:
        names = json.loads(metadata.get(key, "[]"))
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidValueError(f"'{target}': __metadata__ {key} must be a JSON list of parameter names.")
    return names


def state_to_checkpoint(
    state: str | os.PathLike | WebState, path: str | os.PathLike, include_optimizer_state: bool = True
) -> Path:
    """Write a state (file) as an ONNX Runtime checkpoint, to resume in Python.

    The optimizer state goes into ONNX Runtime's group ``group0`` (moments
    ``momentum0``/``momentum1``), with the step and the state's learning rate as
    the group's ``initial_learning_rate`` (the learning rate a resumed session
    starts with), and the step into the session's step property, so
    ``TrainingSession(artifacts, checkpoint=path)`` goes on where JavaScript stopped.

    Args:
        state: A state file or a :class:`WebState`.
        path: The checkpoint to write.
        include_optimizer_state: Also write the step and the moments.

    Returns:
        The checkpoint path.
    """
    web = state if isinstance(state, WebState) else read_state(state)
    optimizer: dict[str, Any] = {}
    if include_optimizer_state and (web.step or web.moments):
        lr = web.learning_rate if web.learning_rate is not None else DEFAULT_LEARNING_RATE
        optimizer[OPTIMIZER_GROUP] = {"step": web.step, "initial_learning_rate": lr, "moments": web.moments}
    properties = dict(web.properties)
    if include_optimizer_state and web.step:
        properties[STEP_PROPERTY] = web.step
    return save_checkpoint((web.trainable, web.frozen), path, optimizer_state=optimizer, properties=properties)


def load_state(session: Any, path: str | os.PathLike) -> WebState:
    """Set a :class:`~onnxblocks.runtime.TrainingSession`'s parameters from a state file.

    Only the parameters are copied (checked by name, dtype and shape); to resume
    training with the optimizer state too, open a session on
    :func:`state_to_checkpoint`'s checkpoint instead.

    Returns:
        The state read.

    Raises:
        onnxblocks.errors.UnknownNameError: if the file has a parameter the session does not.
        ValueError: if the session has parameters the file does not, or a dtype or shape differs.
    """
    web = read_state(path)
    missing = sorted(set(session.parameter_names()) - set(web.parameters))
    if missing:
        raise InvalidValueError(f"'{path}' has no values for the session's parameters {missing[:5]}.")
    session.set_parameters(web.parameters)
    return web
