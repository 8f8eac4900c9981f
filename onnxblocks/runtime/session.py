"""TrainingSession: run training artifacts with ONNX Runtime, without torch.

A session loads the artifacts of one directory (training model, eval model,
optimizer model, checkpoint) into one of two backends (:mod:`onnxblocks.runtime.backend`):
ONNX Runtime's training engine in the training build (``onnxruntime-training``,
through its C bindings, never through ``onnxruntime.training``, which imports
torch), or, for portable artifacts, plain inference sessions of any onnxruntime,
stock included. The API and the checkpoint format are the same on both.

Example:
    >>> session = TrainingSession("artifacts")
    >>> loss, logits = session.train_step(x, labels)
    >>> session.optimizer_step()          # applies the gradients, then resets them
    >>> loss, logits = session.train_and_update(x, labels)   # both at once (one run when fused)
    >>> session.save_checkpoint("ckpt", properties={"epoch": 3})
    >>> session.export_inference_model("model.onnx")

Gradients accumulate: each :meth:`train_step` *adds* its gradients to the
accumulation buffers, and :meth:`optimizer_step` applies their sum. Call
``train_step`` N times and ``optimizer_step`` once to accumulate N micro-batches.

The session is composed of one class per concern (:mod:`onnxblocks.runtime.session_core`);
its artifacts are read and checked once, as an
:class:`~onnxblocks.runtime.artifact_set.ArtifactSet`, before ONNX Runtime loads them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.contracts import STEP_PROPERTY
from onnxblocks._core.errors import StateError
from onnxblocks.runtime import guards as _guards
from onnxblocks.runtime import properties as _props
from onnxblocks.runtime.artifact_set import ArtifactSet
from onnxblocks.runtime.backend import Backend, BackendName, select_backend
from onnxblocks.runtime.checkpoint_extras import average_from_checkpoint
from onnxblocks.runtime.inputs import InputSpec, check_batch
from onnxblocks.runtime.session_checkpoints import CheckpointAccess
from onnxblocks.runtime.session_export import InferenceExport

#: Batch signatures (dtype and shape of each input) whose check passed are remembered, up to this
#: many.
_CHECKED_SIGNATURES = 64


def open_backend(name: BackendName, artifacts: ArtifactSet, device: str, options: Any) -> Backend:
    """Build backend ``name`` over ``artifacts`` (its module is imported on first use)."""
    if name == "portable":
        from onnxblocks.runtime.backend_portable import PortableBackend

        return PortableBackend(artifacts, device, options)
    from onnxblocks.runtime.backend_training import TrainingBuildBackend

    return TrainingBuildBackend(artifacts, device, options)


class TrainingSession(InferenceExport, CheckpointAccess):
    """Training, evaluation, optimizer steps and checkpoints for one set of artifacts.

    Args:
        artifact_dir: Directory written by ``generate_artifacts``.
        prefix: The file-name prefix the artifacts were generated with.
        checkpoint: Checkpoint to start from instead of ``<dir>/<prefix>checkpoint``
            (e.g. one saved by :meth:`save_checkpoint`, to resume training).
        device: ``"cpu"`` (default), ``"cuda"`` or ``"cuda:N"``.
        session_options: An ``onnxruntime.SessionOptions``; default options when None.
        check_inputs: Check each batch's dtypes and shapes against the model's
            inputs before running it, for clear errors (on by default; a batch
            with the types, dtypes, shapes and strides of one already checked is not
            checked again), and the values of index inputs (class labels, token ids)
            against their range on every batch, which ONNX Runtime would crash on or
            compute a wrong loss from (:mod:`onnxblocks.runtime.guards`; one unsigned
            ``max`` per index input, about 1 µs per batch of 64 labels, where no
            ``ignore_index`` is allowed). Empty batches are refused either way.
        backend: ``"auto"`` (default): portable artifacts run on the portable
            backend (any onnxruntime), others on the training build;
            ``"training"`` or ``"portable"`` to insist.

    Attributes:
        files: The :class:`~onnxblocks.runtime.layout.ArtifactFiles` in use.
        step: Number of optimizer steps taken (restored from checkpoints).
        backend: ``"training"`` or ``"portable"``: the backend in use.

    Raises:
        FileNotFoundError: if the directory, training model or checkpoint is missing.
        ValueError: for a backend that cannot run these artifacts.
        onnxblocks.errors.TrainingBuildRequiredError: for non-portable artifacts on
            stock onnxruntime.
    """

    def __init__(
        self,
        artifact_dir: str | os.PathLike,
        prefix: str = "",
        *,
        checkpoint: str | os.PathLike | None = None,
        device: str = "cpu",
        session_options: Any = None,
        check_inputs: bool = True,
        backend: str = "auto",
    ) -> None:
        _guards.check_session_arguments(artifact_dir, prefix, checkpoint, device, check_inputs)
        artifacts = ArtifactSet.read(artifact_dir, prefix, checkpoint)
        self.files = artifacts.files
        self.backend = select_backend(backend, self.files, artifacts.portable)
        self._device_name = device
        self._options = session_options
        self.check_inputs = check_inputs
        self._impl = None
        self._step = 0
        self._pending = 0  # train steps since the gradients were last reset
        self.gradient_reducer = None
        self.weight_ema = None
        self._checked: set[tuple] = set()
        self._open(artifacts)
        self._train_specs = artifacts.training.input_specs(self.input_names)
        self._eval_specs = (
            artifacts.eval.input_specs(self.eval_input_names) if artifacts.eval is not None else []
        )
        self._guards = _guards.session_guards(artifacts, self._train_specs, self._eval_specs)

    # ---------------------------------------------------------------- loading
    def _open(self, artifacts: ArtifactSet) -> None:
        """Start from the checkpoint ``artifacts`` read (and checked against its models)."""
        if self._impl is None:
            self._impl = open_backend(self.backend, artifacts, self._device_name, self._options)
        else:
            self._impl.load(artifacts.checkpoint)
        self._pending = 0
        self._step = int(self._impl.properties().get(STEP_PROPERTY, 0))  # checked with the file
        read = artifacts.checkpoint.contents()
        properties = {n: _props.decode(v) for n, v in read.properties.items()}
        self.weight_ema = average_from_checkpoint(properties, read.frozen)
        # the backend holds the values it needs: the file is not kept mapped
        self._artifacts = artifacts.released()

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Replace parameters, optimizer state and properties with those of a saved checkpoint.

        On the training build, ONNX Runtime cannot swap the state of a live
        session, so the session is rebuilt on the new checkpoint (the models are
        loaded again); the portable backend copies the values into its buffers.

        Returns:
            The checkpoint's user properties (see :attr:`properties`).

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ValueError: if the checkpoint does not belong to these artifacts.
        """
        path = _guards.as_path(path, "path")
        self._open(self._artifacts.with_checkpoint(path))
        return self.properties

    # ---------------------------------------------------------------- steps
    def _batch(self, specs: list[InputSpec], inputs: tuple, what: str) -> Sequence[Any]:
        """``inputs`` checked against ``specs`` (once per signature of types, dtypes, shapes and
        strides), as arrays.

        A batch whose signature passed before gets only the per-batch check (index values in range);
        a new
        signature gets every check (empty batches, dtypes, shapes, contiguity), then is remembered.
        """
        guard = self._guards[what]
        if not self.check_inputs:
            guard.check(inputs, what, values=False)  # empty batches: ONNX Runtime would crash
            return inputs
        try:
            signature = (what, *[(type(a), a.dtype, a.shape, a.strides) for a in inputs])
        except AttributeError:  # not arrays: check_batch converts them
            signature = ()
        if signature in self._checked:
            guard.check_checked(inputs, what)
            return inputs
        guard.check(inputs, what)
        arrays = check_batch(specs, inputs, what)
        if len(self._checked) >= _CHECKED_SIGNATURES:
            self._checked.clear()
        self._checked.add((what, *[(type(a), a.dtype, a.shape, a.strides) for a in arrays]))
        return arrays

    def train_step(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        """Run forward and backward on one batch and accumulate the gradients.

        Args:
            *inputs: One numpy array per training input (see :attr:`input_names`).

        Returns:
            The user outputs as numpy arrays, the loss first.

        Raises:
            TypeError: for a wrong number of inputs.
            ValueError: for an input whose dtype or shape does not fit the model
                (the message names the input, what it expects and what it got).
        """
        outputs = self._backend.train_step(self._batch(self._train_specs, inputs, "train_step"))
        self._pending += 1
        return outputs

    def eval_step(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        """Run the eval model (no gradients) on one batch.

        Returns:
            The eval model's outputs as numpy arrays, the loss first.

        Raises:
            RuntimeError: if the artifacts have no eval model.
            TypeError, ValueError: as for :meth:`train_step`.
        """
        if not self.has_eval_model:
            raise StateError(
                f"The artifacts in '{self.files.directory}' have no eval model; regenerate them "
                "(generate_artifacts writes eval_model.onnx)."
            )
        return self._backend.eval_step(self._batch(self._eval_specs, inputs, "eval_step"))

    def optimizer_step(self, reset_grad: bool = True) -> None:
        """Update the parameters with the gradients accumulated since the last reset.

        Args:
            reset_grad: Reset the gradients afterwards (lazily, at the next
                ``train_step``), so the next step starts a new accumulation.

        Raises:
            RuntimeError: if there is no optimizer model, or no ``train_step`` ran
                since the gradients were last reset (the step would reuse stale
                gradients).
        """
        self._require_optimizer()
        if self._pending == 0:
            raise StateError(
                "optimizer_step: no train_step ran since the gradients were last reset, so there "
                "are no "
                "gradients to apply. Call train_step(...) first."
            )
        if self.gradient_reducer is not None:
            self.gradient_reducer(self)
        self._backend.optimizer_step()
        self._step += 1
        if reset_grad:
            self.lazy_reset_grad()

    def train_and_update(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        """One training step on one batch: ``train_step``, ``optimizer_step`` and the gradient
        reset.

        With a fused step model (portable artifacts generated with
        ``fused_step=True``, the default) it is a single ``run``; otherwise, or
        while gradients of earlier ``train_step`` calls are pending (they are
        applied too), the three calls. After a fused step :meth:`gradients` is
        empty: the fused model keeps no gradients.

        Returns:
            The user outputs as numpy arrays, the loss first.

        Raises:
            RuntimeError: if there is no optimizer model.
            TypeError, ValueError: as for :meth:`train_step`.
        """
        arrays = self._batch(self._train_specs, inputs, "train_step")
        impl = self._impl
        if impl is None or not impl.has_optimizer:
            self._require_optimizer()
        if (
            self._pending or self.gradient_reducer is not None
        ):  # the gradients are read between the two
            outputs = self._backend.train_step(arrays)
            self._pending += 1
            self.optimizer_step()
            return outputs
        outputs = impl.step(arrays)  # type: ignore[union-attr]  # (opened in __init__)
        self._step += 1
        return outputs

    def lazy_reset_grad(self) -> None:
        """Reset the accumulated gradients; the reset happens at the start of the next
        ``train_step``.
        """
        self._backend.lazy_reset_grad()
        self._pending = 0

    @property
    def accumulated_steps(self) -> int:
        """How many ``train_step`` calls added to the gradients since they were last reset."""
        return self._pending

    @property
    def learning_rate(self) -> float:
        """The optimizer's learning rate (stored by ONNX Runtime as float32).

        Raises:
            RuntimeError: if there is no optimizer model.
        """
        return self._require_optimizer().get_learning_rate()

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        checked = _hyper.learning_rate(value, "learning_rate")
        self._require_optimizer().set_learning_rate(checked)

    def __repr__(self) -> str:
        return (
            f"TrainingSession('{self.files.directory}', inputs={self.input_names}, "
            f"outputs={self.output_names}, "
            f"parameters={len(self.parameter_names())}, step={self.step}, "
            f"device='{self._device_name}', "
            f"backend='{self.backend}')"
        )
