"""TrainingSession: run training artifacts with ONNX Runtime, without torch.

A session loads the artifacts of one directory (training model, eval model,
optimizer model, checkpoint) into ONNX Runtime's training engine through its C
bindings (``onnxruntime.capi._pybind_state``), never through
``onnxruntime.training`` (which imports torch).

Example:
    >>> session = TrainingSession("artifacts")
    >>> loss, logits = session.train_step(x, labels)
    >>> session.optimizer_step()          # applies the gradients, then resets them
    >>> session.save_checkpoint("ckpt", properties={"epoch": 3})
    >>> session.export_inference_model("model.onnx")

Gradients accumulate: each :meth:`train_step` *adds* its gradients to the
accumulation buffers, and :meth:`optimizer_step` applies their sum. Call
``train_step`` N times and ``optimizer_step`` once to accumulate N micro-batches.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.errors import UnknownNameError, did_you_mean, preview
from onnxblocks.runtime import _ort
from onnxblocks.runtime import properties as _props
from onnxblocks.runtime.export import export_inference, forward_outputs_hint
from onnxblocks.runtime.inputs import InputSpec, check_batch, read_input_specs
from onnxblocks.runtime.layout import ArtifactFiles

#: Checkpoint property holding the number of optimizer steps taken.
STEP_PROPERTY = "onnxblocks.step"


class TrainingSession:
    """Training, evaluation, optimizer steps and checkpoints for one set of artifacts.

    Args:
        artifact_dir: Directory written by ``generate_artifacts``.
        prefix: The file-name prefix the artifacts were generated with.
        checkpoint: Checkpoint to start from instead of ``<dir>/<prefix>checkpoint``
            (e.g. one saved by :meth:`save_checkpoint`, to resume training).
        device: ``"cpu"`` (default), ``"cuda"`` or ``"cuda:N"``.
        session_options: An ``onnxruntime.SessionOptions``; default options when None.
        check_inputs: Check each batch's dtypes and shapes against the model's
            inputs before running it, for clear errors (cheap; on by default).

    Attributes:
        files: The :class:`~onnxblocks.runtime.layout.ArtifactFiles` in use.
        step: Number of optimizer steps taken (restored from checkpoints).

    Raises:
        FileNotFoundError: if the directory, training model or checkpoint is missing.
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
    ) -> None:
        self.files = ArtifactFiles.find(artifact_dir, prefix)
        self._device_name = device
        self._device = _ort.make_device(device)
        self._options = session_options if session_options is not None else _ort.capi().SessionOptions()
        self.check_inputs = check_inputs
        self._state: Any = None
        self.step = 0
        self._pending = 0  # train steps since the gradients were last reset
        self._checkpoint_path = Path(checkpoint) if checkpoint is not None else self.files.checkpoint
        self._open(self._checkpoint_path)
        self._train_specs = read_input_specs(self.files.training_model, self.input_names)
        self._eval_specs = (
            read_input_specs(self.files.eval_model, self.eval_input_names) if self.files.eval_model else []
        )

    # ---------------------------------------------------------------- loading
    def _open(self, checkpoint: Path) -> None:
        C = _ort.capi()
        if not checkpoint.exists():
            raise FileNotFoundError(
                f"Checkpoint '{checkpoint}' does not exist. Pass a file written by "
                "TrainingSession.save_checkpoint or generate_artifacts."
            )
        try:
            state = C.load_checkpoint(os.fspath(checkpoint))
        except RuntimeError as exc:
            raise ValueError(f"Cannot read checkpoint '{checkpoint}': {_ort.clean_message(exc)}") from None
        if self._state is not None:
            before, after = set(self._state.parameter_names()), set(state.parameter_names())
            if before != after:
                raise ValueError(
                    f"Checkpoint '{checkpoint}' holds parameters {preview(sorted(after))}, but the session has "
                    f"{preview(sorted(before))}. Load a checkpoint saved from these artifacts."
                )
        eval_path = os.fspath(self.files.eval_model) if self.files.eval_model else None
        try:
            module = C.Module(os.fspath(self.files.training_model), state, eval_path, self._device, self._options)
        except RuntimeError as exc:
            raise ValueError(
                f"ONNX Runtime cannot load the training model '{self.files.training_model}' with checkpoint "
                f"'{checkpoint}': {_ort.clean_message(exc)}. Check that the checkpoint belongs to these artifacts."
            ) from None
        optimizer = None
        if self.files.optimizer_model is not None:
            optimizer = C.Optimizer(os.fspath(self.files.optimizer_model), state, self._device, self._options)
        self._state, self._module, self._optimizer = state, module, optimizer
        self._names = {
            "train_in": list(module.input_names(True)),
            "train_out": list(module.output_names(True)),
            "eval_in": list(module.input_names(False)) if eval_path else [],
            "eval_out": list(module.output_names(False)) if eval_path else [],
        }
        self._pending = 0
        stored = self._raw_properties()
        self.step = int(stored.get(STEP_PROPERTY, 0))

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Replace parameters, optimizer state and properties with those of a saved checkpoint.

        ONNX Runtime cannot swap the state of a live session, so the session is
        rebuilt on the new checkpoint (the models are loaded again).

        Returns:
            The checkpoint's user properties (see :attr:`properties`).

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ValueError: if the checkpoint does not belong to these artifacts.
        """
        path = Path(path)
        self._open(path)
        self._checkpoint_path = path
        return self.properties

    # ------------------------------------------------------------- signature
    @property
    def input_names(self) -> list[str]:
        """Names of the training model's user inputs, in the order ``train_step`` takes them."""
        return list(self._names["train_in"])

    @property
    def output_names(self) -> list[str]:
        """Names of the training model's user outputs (the loss first)."""
        return list(self._names["train_out"])

    @property
    def eval_input_names(self) -> list[str]:
        """Names of the eval model's inputs, in the order ``eval_step`` takes them."""
        return list(self._names["eval_in"])

    @property
    def eval_output_names(self) -> list[str]:
        """Names of the eval model's outputs (the loss first)."""
        return list(self._names["eval_out"])

    @property
    def input_specs(self) -> list[InputSpec]:
        """Dtype and shape of each training input."""
        return list(self._train_specs)

    @property
    def has_optimizer(self) -> bool:
        """True when the artifacts include an optimizer model."""
        return self._optimizer is not None

    @property
    def has_eval_model(self) -> bool:
        """True when the artifacts include an eval model."""
        return self.files.eval_model is not None

    @property
    def device(self) -> str:
        """The device the session runs on."""
        return self._device_name

    # ---------------------------------------------------------------- steps
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
        arrays = check_batch(self._train_specs, inputs, "train_step") if self.check_inputs else list(inputs)
        fetches = _ort.capi().OrtValueVector()
        self._module.train_step(arrays, fetches)
        self._pending += 1
        return tuple(f.numpy() for f in fetches)

    def eval_step(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        """Run the eval model (no gradients) on one batch.

        Returns:
            The eval model's outputs as numpy arrays, the loss first.

        Raises:
            RuntimeError: if the artifacts have no eval model.
            TypeError, ValueError: as for :meth:`train_step`.
        """
        if not self.has_eval_model:
            raise RuntimeError(
                f"The artifacts in '{self.files.directory}' have no eval model; regenerate them "
                "(generate_artifacts writes eval_model.onnx)."
            )
        arrays = check_batch(self._eval_specs, inputs, "eval_step") if self.check_inputs else list(inputs)
        fetches = _ort.capi().OrtValueVector()
        self._module.eval_step(arrays, fetches)
        return tuple(f.numpy() for f in fetches)

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
        optimizer = self._require_optimizer()
        if self._pending == 0:
            raise RuntimeError(
                "optimizer_step: no train_step ran since the gradients were last reset, so there are no "
                "gradients to apply. Call train_step(...) first."
            )
        optimizer.optimizer_step()
        self.step += 1
        if reset_grad:
            self.lazy_reset_grad()

    def lazy_reset_grad(self) -> None:
        """Reset the accumulated gradients; the reset happens at the start of the next ``train_step``."""
        self._module.lazy_reset_grad()
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
        return float(self._require_optimizer().get_learning_rate())

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        value = float(value)
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"learning_rate must be a finite number >= 0, got {value}.")
        self._require_optimizer().set_learning_rate(value)

    def _require_optimizer(self) -> Any:
        if self._optimizer is None:
            raise RuntimeError(
                f"The artifacts in '{self.files.directory}' have no optimizer model; regenerate them with "
                "optimizer=... (e.g. onnxblocks.optim.AdamW())."
            )
        return self._optimizer

    # ------------------------------------------------------------ parameters
    def parameter_names(self, trainable_only: bool = False) -> list[str]:
        """Names of the parameters in the checkpoint state, sorted."""
        names = sorted(self._state.parameter_names())
        if trainable_only:
            names = [n for n in names if self._state.get_parameter(n).requires_grad]
        return names

    def is_trainable(self, name: str) -> bool:
        """True when parameter ``name`` is trained (False: frozen)."""
        self._check_parameter(name)
        return bool(self._state.get_parameter(name).requires_grad)

    def get_parameter(self, name: str) -> np.ndarray:
        """A copy of parameter ``name`` as a numpy array.

        Raises:
            UnknownNameError: if there is no such parameter.
        """
        self._check_parameter(name)
        return np.array(self._state.get_parameter(name).data.numpy(), copy=True)

    def parameters(self, trainable_only: bool = False) -> dict[str, np.ndarray]:
        """Copies of all parameters (or only the trainable ones), by name."""
        return {n: self.get_parameter(n) for n in self.parameter_names(trainable_only)}

    def gradients(self) -> dict[str, np.ndarray]:
        """Copies of the accumulated gradients of the trainable parameters, by name.

        After :meth:`optimizer_step` / :meth:`lazy_reset_grad` the buffers keep
        their old values until the next ``train_step`` resets them.
        """
        out = {}
        for name in self.parameter_names(trainable_only=True):
            grad = self._state.get_parameter(name).grad
            if grad.has_value():
                out[name] = np.array(grad.numpy(), copy=True)
        return out

    def set_parameter(self, name: str, value: Any) -> None:
        """Overwrite parameter ``name`` with ``value`` (same dtype and shape).

        Raises:
            UnknownNameError: if there is no such parameter.
            ValueError: if dtype or shape differ.
        """
        self.set_parameters({name: value})

    def set_parameters(self, values: Mapping[str, Any]) -> None:
        """Overwrite several parameters; all are checked before any is written.

        Raises:
            UnknownNameError: if a name is not a parameter.
            ValueError: if a dtype or shape differs from the parameter's.
        """
        C = _ort.capi()
        cpu = _ort.make_device("cpu")
        checked = {}
        for name, raw in values.items():
            self._check_parameter(name)
            current = self._state.get_parameter(name).data
            array = np.ascontiguousarray(raw)
            want_shape = tuple(current.shape())
            want_dtype = current.numpy().dtype
            if array.dtype != want_dtype or array.shape != want_shape:
                raise ValueError(
                    f"parameter '{name}' is {want_dtype} with shape {want_shape}; got {array.dtype} with shape "
                    f"{array.shape}. Pass an array of the parameter's dtype and shape."
                )
            checked[name] = array
        for name, array in checked.items():
            self._state.copy_parameter_from(name, C.OrtValue.ortvalue_from_numpy(array, cpu))

    def _check_parameter(self, name: str) -> None:
        if not self._state.has_parameter(name):
            names = self.parameter_names()
            raise UnknownNameError(
                f"'{name}' is not a parameter of the checkpoint.{did_you_mean(name, names)} "
                f"Parameters: {preview(names)}."
            )

    @property
    def num_parameters(self) -> int:
        """Number of trainable elements (as ONNX Runtime counts them)."""
        return int(self._module.get_parameters_size(True))

    # ----------------------------------------------------------- checkpoints
    def _raw_properties(self) -> dict[str, Any]:
        return {n: _props.decode(self._state.get_property(n)) for n in self._state.property_names()}

    @property
    def properties(self) -> dict[str, Any]:
        """User properties of the current state (those saved with ``save_checkpoint``), decoded.

        Keys starting with ``"onnxblocks."`` are the runtime's own (step counter,
        data-loader and scheduler state); they are included.
        """
        return self._raw_properties()

    def save_checkpoint(
        self,
        path: str | os.PathLike,
        include_optimizer_state: bool = True,
        properties: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write parameters, optimizer state, step counter and ``properties`` to ``path``.

        The file is written next to its destination and renamed into place, so an
        interrupted save never leaves a half-written checkpoint.

        Args:
            path: Destination file.
            include_optimizer_state: Save the optimizer's moments and step too, so
                that training resumes exactly.
            properties: Extra values to store; ints, strs and float32-exact floats
                natively, anything else JSON-encodable exactly (see
                :mod:`onnxblocks.runtime.properties`).

        Returns:
            The checkpoint path.

        Raises:
            ValueError: for a property name with the reserved ``onnxblocks.`` prefix.
            TypeError: for a property value that cannot be stored.
        """
        user = dict(properties or {})
        _props.check_names(user)
        return self._save(Path(path), include_optimizer_state, user)

    def _save(self, path: Path, include_optimizer_state: bool, values: Mapping[str, Any]) -> Path:
        C = _ort.capi()
        if include_optimizer_state and self._optimizer is None:
            include_optimizer_state = False
        encoded = {name: _props.encode(value, name) for name, value in values.items()}
        encoded[STEP_PROPERTY] = int(self.step)
        for name, value in encoded.items():
            self._state.add_property(name, value)
        from onnxblocks.io import atomic_file

        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, companions=True) as temp:  # ONNX Runtime may write <temp>.data beside it
            C.save_checkpoint(self._state, os.fspath(temp), include_optimizer_state)
        return path

    def set_properties(self, properties: Mapping[str, Any]) -> None:
        """Store properties in the in-memory state (saved with the next checkpoint)."""
        _props.check_names(properties)
        for name, value in properties.items():
            self._state.add_property(name, _props.encode(value, name))

    # --------------------------------------------------------------- export
    def default_inference_outputs(self) -> list[str]:
        """The outputs :meth:`export_inference_model` keeps by default.

        These are the eval model's outputs after the loss, i.e. the
        ``additional_output_names`` the artifacts were generated with.
        """
        outputs = self.eval_output_names[1:]
        model_outputs = forward_outputs_hint(self.files.eval_model)
        return model_outputs or outputs

    def export_inference_model(self, path: str | os.PathLike, output_names: Sequence[str] | None = None) -> Path:
        """Write an inference model with the current (trained) parameters.

        The eval model is cut down to the nodes that compute ``output_names``;
        the loss and label inputs are dropped.

        Args:
            path: Destination ``.onnx`` file (written atomically).
            output_names: Outputs to keep; default :meth:`default_inference_outputs`.

        Returns:
            The path written.

        Raises:
            RuntimeError: if the artifacts have no eval model.
            ValueError: if no output names are given and none can be inferred, or
                ONNX Runtime rejects them.
        """
        if not self.has_eval_model:
            raise RuntimeError("export_inference_model needs the eval model, but the artifacts have none.")
        names = list(output_names) if output_names is not None else self.default_inference_outputs()
        return export_inference(self._module, Path(path), names, self.eval_output_names)

    def __repr__(self) -> str:
        return (
            f"TrainingSession('{self.files.directory}', inputs={self.input_names}, outputs={self.output_names}, "
            f"parameters={len(self.parameter_names())}, step={self.step}, device='{self._device_name}')"
        )
