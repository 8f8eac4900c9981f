"""The runtime's own driver for optimizer models in standard ops, on the training build.

ONNX Runtime's training ``Optimizer`` runs only its ``AdamWOptimizer`` and
``SGDOptimizerV2`` models. An optimizer of :mod:`onnxblocks.optim` written in
standard ops (SGD with momentum, Adam, AdamW with amsgrad, Adagrad, RMSprop,
parameter groups; its model carries the ``onnxblocks.optimizer`` metadata) is run
here instead: an ``InferenceSession`` of the optimizer model, fed the parameters
and the accumulated gradients from ONNX Runtime's ``CheckpointState`` and the
state tensors this driver keeps, and the updated parameters copied back into the
state. The state is saved in ONNX Runtime's checkpoint layout (group ``group0``,
``momentum<k>`` per state tensor, the step and initial learning rate), the same
layout the portable backend reads and writes, so a run moves between backends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxblocks._core.contracts import (
    DEFAULT_LEARNING_RATE,
    GRADIENTS,
    LEARNING_RATE,
    OPTIMIZER_METADATA,
    PARAMS,
    STEP,
)
from onnxblocks._core.errors import InvalidValueError, PortabilityError, preview
from onnxblocks.checkpoint import OptimizerState, load_checkpoint, save_checkpoint
from onnxblocks.runtime import _ort


def standard_optimizer_order(path: Path, model: onnx.ModelProto | None = None) -> list[str] | None:
    """The parameter order of an optimizer model in standard ops, or None for ONNX Runtime's own
    optimizer models.

    The order is the ``params`` of the model's
    :class:`~onnxblocks.portable.optimizer_spec.OptimizerSpec`, as
    :func:`onnxblocks.portable.optimizer.read_optimizer` (the one reader of optimizer models on
    disk) reads it from the ``onnxblocks.optimizer`` metadata.

    Raises:
        InvalidValueError: for an unreadable model or metadata.
    """
    if model is None:  # (an artifact set hands the model it read)
        try:
            model = onnx.load(os.fspath(path), load_external_data=False)
        except Exception as exc:
            raise InvalidValueError(f"Cannot read the optimizer model '{path}': {exc}") from None
    if not any(p.key == OPTIMIZER_METADATA for p in model.metadata_props):
        return None  # ONNX Runtime's own optimizer ops: its Optimizer runs them
    # Imported here: the portable package loads onnx-ir, which sessions of ONNX Runtime's own
    # optimizer models never need.
    from onnxblocks.portable.optimizer import read_optimizer

    try:
        spec = read_optimizer(model)
    except PortabilityError as exc:
        raise InvalidValueError(
            f"The optimizer model '{path}' has unreadable '{OPTIMIZER_METADATA}' metadata "
            f"({exc}). Regenerate the artifacts."
        ) from None
    return [name for name, _ in spec.params]


class StandardOptimizerDriver:
    """Runs an optimizer model in standard ops over a training-build ``CheckpointState`` (see the
    module docs).

    Args:
        path: The optimizer model.
        order: Its parameters, in the order of its ``params`` sequence.
        state: ONNX Runtime's ``CheckpointState``.
        checkpoint: The checkpoint the state was loaded from (its optimizer state is read from it).
        stored: Its optimizer state, when already read (the file is then not read again).
        C: ONNX Runtime's training bindings.
    """

    #: ONNX Runtime's ``save_checkpoint`` does not write this state: :meth:`add_state` does.
    saved_by_onnxruntime = False

    def __init__(
        self,
        path: Path,
        order: list[str],
        state: Any,
        checkpoint: Path,
        C: Any,
        stored: OptimizerState | None = None,
    ) -> None:
        ort = _ort.onnxruntime()
        self._session = ort.InferenceSession(
            os.fspath(path), sess_options=_ort.session_options(), providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in self._session.get_inputs()]
        self._state_inputs = [n for n in names if n not in (LEARNING_RATE, STEP, PARAMS, GRADIENTS)]
        missing = [n for n in order if not state.has_parameter(n)]
        if missing:
            raise InvalidValueError(
                f"The optimizer model '{path}' updates {preview(missing)}, which the checkpoint "
                "does not hold. Use "
                "the optimizer model generated with these artifacts."
            )
        self._order, self._state, self._C = order, state, C
        self._cpu = _ort.make_device("cpu")
        self.learning_rate = self._initial_lr = DEFAULT_LEARNING_RATE
        self.step = 0
        self._moments = {
            n: [np.zeros_like(self._param(n)) for _ in self._state_inputs] for n in order
        }
        self._read(checkpoint, stored)

    def _param(self, name: str) -> np.ndarray:
        return np.array(self._state.get_parameter(name).data.numpy(), copy=True)

    def _read(self, checkpoint: Path, stored: OptimizerState | None) -> None:
        if stored is None:
            stored = load_checkpoint(checkpoint).optimizer_state
        group = stored.primary
        if group is None:
            return
        for name in self._order:
            saved = group.slots(name)
            if saved and len(saved) != len(self._state_inputs):
                raise InvalidValueError(
                    f"Checkpoint '{checkpoint}' holds {len(saved)} optimizer state tensor(s) for "
                    f"'{name}'; this "
                    f"optimizer keeps {len(self._state_inputs)}. Load a checkpoint saved with "
                    "the same optimizer, or "
                    "save it with include_optimizer_state=False."
                )
            if saved:
                self._moments[name] = [np.array(m, copy=True) for m in saved]
        self.step = group.step
        self.learning_rate = self._initial_lr = group.initial_learning_rate

    def optimizer_step(self) -> None:
        """One update: the step being taken is ``step + 1``."""
        grads = []
        for name in self._order:
            grad = self._state.get_parameter(name).grad
            grads.append(
                np.array(grad.numpy(), copy=True)
                if grad.has_value()
                else np.zeros_like(self._param(name))
            )
        feeds: dict[str, Any] = {
            LEARNING_RATE: np.array([self.learning_rate], np.float32),
            STEP: np.array([self.step + 1], np.int64),
            PARAMS: [self._param(n) for n in self._order],
            GRADIENTS: grads,
        }
        for k, name in enumerate(self._state_inputs):
            feeds[name] = [self._moments[n][k] for n in self._order]
        try:
            params, *states = self._session.run(None, feeds)
        except Exception as exc:
            raise _ort.run_error(exc, "the optimizer model") from None
        for i, name in enumerate(self._order):
            value = self._C.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(params[i]), self._cpu)
            self._state.copy_parameter_from(name, value)
            self._moments[name] = [np.array(s[i], copy=True) for s in states]
        self.step += 1

    def add_state(self, path: Path) -> None:
        """Add this optimizer's state to the checkpoint ONNX Runtime wrote at ``path`` (without
        optimizer state).
        """
        ck = load_checkpoint(path)
        state = OptimizerState.single(
            self.step, self._initial_lr, {n: self._moments[n] for n in self._order}
        )
        save_checkpoint(
            (ck.trainable, ck.frozen), path, optimizer_state=state, properties=ck.properties
        )
