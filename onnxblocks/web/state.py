"""The training state file shared with the JavaScript client: parameters and optimizer state in
safetensors.

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

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core import dirlock as _dirlock
from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.contracts import (
    DEFAULT_LEARNING_RATE,
    MAX_STATES,
    STEP_PROPERTY,
    ArtifactNames,
    state_names,
)
from onnxblocks._core.errors import FileMissingError, InvalidTypeError, InvalidValueError
from onnxblocks.checkpoint import Checkpoint, OptimizerState, load_checkpoint, save_checkpoint
from onnxblocks.checkpoint.save import EXTRA_PREFIX
from onnxblocks.runtime.layout import remove_leftovers
from onnxblocks.web import state_metadata as _meta
from onnxblocks.web.safetensors import read_safetensors, write_safetensors

#: The state file's name inside an artifact directory.
STATE_FILE = "params.safetensors"
#: ``__metadata__["format"]`` of state files.
STATE_FORMAT = "onnxblocks-web/1"


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
        states: The state tensors per trainable parameter the optimizer declares (AdamW's two
        moments by
            default; SGD with momentum one, Adam with amsgrad three: ``onnxblocks.portable.rules``),
            named
            ``state_names(p, states)`` in the file; every trainable parameter has all of them or
            none.
    """

    trainable: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray]
    moments: dict[str, list[np.ndarray]] = field(default_factory=dict)
    step: int = 0
    learning_rate: float | None = None
    properties: dict[str, int | float | str] = field(default_factory=dict)
    states: int = 2

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        """Trainable and frozen parameters together."""
        return {**self.trainable, **self.frozen}

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> WebState:
        """The state of a loaded checkpoint (ONNX Runtime's optimizer group ``group0``, if it has
        one).
        """
        if checkpoint.is_nominal:
            raise InvalidValueError(
                "A nominal checkpoint holds no parameter values; generate the artifacts with "
                "nominal_checkpoint=False for the web."
            )
        group = checkpoint.optimizer_state.primary
        moments = {k: list(v) for k, v in (group.moments if group else {}).items() if len(v)}
        counts = {len(v) for v in moments.values()}
        return cls(
            trainable=dict(checkpoint.trainable),
            # a weight EMA's tensors (EXTRA_PREFIX) stay in Python: the web state carries the
            # model's parameters
            frozen={n: v for n, v in checkpoint.frozen.items() if not n.startswith(EXTRA_PREFIX)},
            moments=moments,
            states=counts.pop() if len(counts) == 1 else 2,
            step=group.step if group else 0,
            learning_rate=group.initial_learning_rate if group else None,
            properties=dict(checkpoint.properties),
        )


def _checkpoint_path(source: str | os.PathLike) -> Path:
    path = Path(os.fspath(source))
    if not path.is_dir():
        return path
    remove_leftovers(path)  # an artifact directory: what killed writers left in it goes first
    return path / ArtifactNames().checkpoint


def write_state(
    source: str | os.PathLike | Checkpoint | WebState, path: str | os.PathLike | None = None
) -> Path:
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
            raise InvalidValueError(
                "write_state: pass `path` when the source is not a file or directory."
            )
        state = source if isinstance(source, WebState) else WebState.from_checkpoint(source)
    else:
        checkpoint = _checkpoint_path(source)
        # a generate_artifacts call replacing the set moves the old checkpoint aside first
        directory = checkpoint.parent if Path(os.fspath(source)).is_dir() else None
        with _dirlock.reading_lock(directory):
            if not checkpoint.exists():
                raise FileMissingError(
                    f"No checkpoint at '{checkpoint}'. Pass an artifact directory or a checkpoint "
                    "written by generate_artifacts or TrainingSession.save_checkpoint."
                )
            loaded = load_checkpoint(checkpoint)
        state = WebState.from_checkpoint(loaded)
        path = checkpoint.with_name(STATE_FILE) if path is None else path
    state = copy.copy(state)
    check_state(state, "write_state")  # never write a file read_state would refuse
    tensors: dict[str, np.ndarray] = {**state.trainable, **state.frozen}
    for name, moments in state.moments.items():
        if name not in state.trainable:
            raise InvalidValueError(
                f"write_state: moments given for '{name}', which is not a trainable parameter."
            )
        if len(moments) not in (0, state.states):
            raise InvalidValueError(
                f"write_state: '{name}' has {len(moments)} optimizer state tensors, but the "
                "state declares "
                f"{state.states} per parameter (WebState.states)."
            )
        tensors.update(zip(state_names(name, state.states), moments, strict=False))
    metadata = {
        "format": STATE_FORMAT,
        "trainable": json.dumps(list(state.trainable)),
        "frozen": json.dumps(list(state.frozen)),
        "step": str(int(state.step)),
        "properties": json.dumps({k: [type(v).__name__, v] for k, v in state.properties.items()}),
    }
    if state.learning_rate is not None:
        metadata["learning_rate"] = json.dumps(float(state.learning_rate))
    if state.states != 2:  # two moments (AdamW) is what a file without the key means
        metadata["states"] = str(state.states)
    return write_safetensors(path, tensors, metadata)


def read_state(path: str | os.PathLike) -> WebState:
    """Read a state file (written by :func:`write_state` or by the JavaScript client), trusting
    nothing in it.

    The file's layout is checked by :func:`~onnxblocks.web.read_safetensors`
    (offsets, sizes, dtypes, shapes, repeated names); its content by
    :func:`check_state`: the parameter lists, the moments, and every scalar
    (step, learning rate, properties) through the checks the session's setters make.

    Raises:
        onnxblocks.errors.FileMissingError: if the file does not exist.
        onnxblocks.errors.InvalidValueError: if it is not a state file of this format, or is
        inconsistent;
            the message names the file.
        onnxblocks.errors.InvalidTypeError: for a dtype the format does not hold.
    """
    target = Path(os.fspath(path))
    tensors, metadata = read_safetensors(target)
    if metadata.get("format") != STATE_FORMAT:
        raise InvalidValueError(
            f"'{target}' is not an onnxblocks web state file (__metadata__ format is "
            f"{metadata.get('format')!r}, "
            f"expected {STATE_FORMAT!r}). Write one with onnxblocks.web.write_state."
        )
    trainable, frozen = (
        _meta.names(metadata, "trainable", target),
        _meta.names(metadata, "frozen", target),
    )
    listed = [*trainable, *frozen]
    missing = [n for n in listed if n not in tensors]
    if missing:
        raise InvalidValueError(
            f"'{target}': parameters {missing[:5]} are listed in the metadata but have no tensor."
        )
    count = _meta.state_count(metadata, target)
    moments = {
        name: [tensors[m] for m in state_names(name, count) if m in tensors] for name in trainable
    }
    known = set(listed) | {m for name in trainable for m in state_names(name, count)}
    stray = [n for n in tensors if n not in known]
    if stray:
        raise InvalidValueError(
            f"'{target}': tensors {stray[:5]} are neither listed parameters nor their moments. "
            "Write the file with "
            "onnxblocks.web.write_state or the JavaScript client."
        )
    state = WebState(
        trainable={n: tensors[n] for n in trainable},
        frozen={n: tensors[n] for n in frozen},
        moments={k: v for k, v in moments.items() if v},
        step=_meta.step(metadata, target),
        learning_rate=_meta.json_field(metadata, "learning_rate", target),
        properties=_meta.properties(metadata, target),
        states=count,
    )
    check_state(state, f"'{target}'")
    return state


def check_state(state: WebState, where: str = "state") -> None:
    """Check a state's parameters, moments and scalars, and decode its properties in place.

    The one validation of a state, for :func:`read_state` and for a
    :class:`WebState` given to :func:`state_to_checkpoint`: names unique and each
    parameter trainable or frozen, not both; moments none or two per trainable
    parameter, of its dtype and shape; ``step`` and ``learning_rate`` through the
    session's checks (:mod:`onnxblocks._core.hyperparams`); each property an int
    in int64, a float or a str, through the checks of ``set_properties``.

    Raises:
        onnxblocks.errors.InvalidValueError, onnxblocks.errors.InvalidTypeError: naming ``where``
        and the field.
    """
    both = sorted(set(state.trainable) & set(state.frozen))
    if both:
        raise InvalidValueError(
            f"{where}: parameters {both[:5]} are listed as trainable and as frozen."
        )
    for name, moments in state.moments.items():
        if name not in state.trainable:
            raise InvalidValueError(
                f"{where}: moments given for '{name}', which is not a trainable parameter."
            )
        if not (isinstance(state.states, int) and 1 <= state.states <= MAX_STATES):
            raise InvalidValueError(
                f"{where}: states must be an int in [1, {MAX_STATES}], got {state.states!r:.40}."
            )
        names = state_names(name, state.states)
        if len(moments) not in (0, state.states):
            if state.states == 2:
                count = (
                    "only one of its two moments"
                    if len(moments) == 1
                    else f"{len(moments)} moments"
                )
                raise InvalidValueError(
                    f"{where}: '{name}' has {count}; a state holds none or both of {list(names)}."
                )
            raise InvalidValueError(
                f"{where}: '{name}' has {len(moments)} optimizer state tensors; the optimizer "
                "declares "
                f"{state.states} ({list(names)}): give all or none."
            )
        param = np.asarray(state.trainable[name])
        for moment, value in zip(names, moments, strict=False):
            value = np.asarray(value)
            if value.shape != param.shape or value.dtype != param.dtype:
                raise InvalidValueError(
                    f"{where}: moment '{moment}' is {value.dtype} {value.shape}, its parameter "
                    f"{param.dtype} {param.shape}."
                )
    try:
        state.step = _hyper.step(state.step, "step")
        if state.learning_rate is not None:
            state.learning_rate = _hyper.learning_rate(state.learning_rate, "learning_rate")
        state.properties = {
            name: _meta.property_value(name, value) for name, value in state.properties.items()
        }
    except (InvalidValueError, InvalidTypeError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def state_to_checkpoint(
    state: str | os.PathLike | WebState,
    path: str | os.PathLike,
    include_optimizer_state: bool = True,
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
    if isinstance(state, WebState):
        web = copy.copy(state)
        check_state(web, "state")
    else:
        web = read_state(state)
    optimizer = OptimizerState()
    if include_optimizer_state and (web.step or web.moments):
        lr = web.learning_rate if web.learning_rate is not None else DEFAULT_LEARNING_RATE
        optimizer = OptimizerState.single(web.step, lr, web.moments)
    properties = dict(web.properties)
    if include_optimizer_state and web.step:
        properties[STEP_PROPERTY] = web.step
    return save_checkpoint(
        (web.trainable, web.frozen), path, optimizer_state=optimizer, properties=properties
    )


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
        raise InvalidValueError(
            f"'{path}' has no values for the session's parameters {missing[:5]}."
        )
    session.set_parameters(web.parameters)
    return web
