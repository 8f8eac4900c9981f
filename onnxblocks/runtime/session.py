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
    >>> loss, logits = session.train_and_update(x, labels)   # both at once (one run with a fused step model)
    >>> session.save_checkpoint("ckpt", properties={"epoch": 3})
    >>> session.export_inference_model("model.onnx")

Gradients accumulate: each :meth:`train_step` *adds* its gradients to the
accumulation buffers, and :meth:`optimizer_step` applies their sum. Call
``train_step`` N times and ``optimizer_step`` once to accumulate N micro-batches.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.contracts import STEP_PROPERTY
from onnxblocks._core.errors import (
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    StateError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks.checkpoint.save import EXTRA_PREFIX
from onnxblocks.runtime import guards as _guards
from onnxblocks.runtime import properties as _props
from onnxblocks.runtime.backend import Backend, BackendName, select_backend
from onnxblocks.runtime.ema import (
    EMA_PREFIX,
    EMA_PROPERTY,
    WeightEMA,
    ema_from_checkpoint,
    ema_property,
    write_ema_tensors,
)
from onnxblocks.runtime.export import export_inference, forward_outputs_hint
from onnxblocks.runtime.inputs import InputSpec, check_batch, read_input_specs
from onnxblocks.runtime.layout import ArtifactFiles, artifact_lora

if TYPE_CHECKING:
    from onnxblocks.peft.info import LoraInfo

#: The LoRA record not read yet (it is read from the training model's metadata on first use).
_UNREAD = object()
#: Batch signatures (dtype and shape of each input) whose check passed are remembered, up to this
#: many.
_CHECKED_SIGNATURES = 64


def open_backend(
    name: BackendName, files: ArtifactFiles, checkpoint: Path, device: str, options: Any
) -> Backend:
    """Build backend ``name`` over ``files``, starting from ``checkpoint`` (its module is
    imported on first use).
    """
    if name == "portable":
        from onnxblocks.runtime.backend_portable import PortableBackend

        return PortableBackend(files, checkpoint, device, options)
    from onnxblocks.runtime.backend_training import TrainingBuildBackend

    return TrainingBuildBackend(files, checkpoint, device, options)


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
        self.files = ArtifactFiles.find(artifact_dir, prefix)
        self.backend = select_backend(backend, self.files)
        self._device_name = device
        self._options = session_options
        self.check_inputs = check_inputs
        self._impl: Backend | None = None
        self._step = 0
        self._pending = 0  # train steps since the gradients were last reset
        #: Called with the session by :meth:`optimizer_step` before the parameters are updated
        #: (data-parallel
        #: training all-reduces the gradients there: ``onnxblocks.torch.distributed``); None:
        #: nothing.
        self.gradient_reducer: Callable[[TrainingSession], None] | None = None
        #: The weight EMA the session's checkpoints hold (``onnxblocks.runtime.WeightEMA``: attached
        #: by it in
        #: ``fit``, restored from a checkpoint that holds one); None: none.
        self.weight_ema: WeightEMA | None = None
        self._checked: set[tuple] = set()
        self._lora: object = _UNREAD
        self._checkpoint_path = (
            Path(checkpoint) if checkpoint is not None else self.files.checkpoint
        )
        self._open(self._checkpoint_path)
        self._train_specs = read_input_specs(self.files.training_model, self.input_names)
        self._eval_specs = (
            read_input_specs(self.files.eval_model, self.eval_input_names)
            if self.files.eval_model
            else []
        )
        self._guards = _guards.session_guards(self.files, self._train_specs, self._eval_specs)

    # ---------------------------------------------------------------- loading
    def _open(self, checkpoint: Path) -> None:
        if not checkpoint.exists():
            raise FileMissingError(
                f"Checkpoint '{checkpoint}' does not exist. Pass a file written by "
                "TrainingSession.save_checkpoint or generate_artifacts."
            )
        _guards.check_checkpoint_for(
            self.files, checkpoint
        )  # before ONNX Runtime sees it: a bad one can crash it
        if self._impl is None:
            self._impl = open_backend(
                self.backend, self.files, checkpoint, self._device_name, self._options
            )
        else:
            self._impl.load(checkpoint)
        self._pending = 0
        self._step = int(
            self._impl.properties().get(STEP_PROPERTY, 0)
        )  # checked with the checkpoint
        self.weight_ema = ema_from_checkpoint(self._raw_properties(), checkpoint)

    @property
    def _backend(self) -> Backend:
        assert self._impl is not None
        return self._impl

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
        self._open(path)
        self._checkpoint_path = path
        return self.properties

    # ------------------------------------------------------------- signature
    @property
    def input_names(self) -> list[str]:
        """Names of the training model's user inputs, in the order ``train_step`` takes them."""
        return list(self._backend.train_inputs)

    @property
    def output_names(self) -> list[str]:
        """Names of the training model's user outputs (the loss first)."""
        return list(self._backend.train_outputs)

    @property
    def eval_input_names(self) -> list[str]:
        """Names of the eval model's inputs, in the order ``eval_step`` takes them."""
        return list(self._backend.eval_inputs)

    @property
    def eval_output_names(self) -> list[str]:
        """Names of the eval model's outputs (the loss first)."""
        return list(self._backend.eval_outputs)

    @property
    def input_specs(self) -> list[InputSpec]:
        """Dtype and shape of each training input."""
        return list(self._train_specs)

    @property
    def has_optimizer(self) -> bool:
        """True when the artifacts include an optimizer model (or a fused step model)."""
        return self._backend.has_optimizer

    @property
    def has_eval_model(self) -> bool:
        """True when the artifacts include an eval model."""
        return self.files.eval_model is not None

    @property
    def has_fused_step(self) -> bool:
        """True when the artifacts include a fused step model, so :meth:`train_and_update` is one
        run.
        """
        return self._backend.has_fused_step

    @property
    def device(self) -> str:
        """The device the session runs on."""
        return self._device_name

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
    def step(self) -> int:
        """Number of optimizer steps taken (restored from checkpoints, saved with them)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = _hyper.step(
            value, "step"
        )  # an int in [0, 2**53 - 1]: refused here, not at the next step

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

    def _require_optimizer(self) -> Backend:
        if not self._backend.has_optimizer:
            raise StateError(
                f"The artifacts in '{self.files.directory}' have no optimizer model; regenerate "
                "them with "
                "optimizer=... (e.g. onnxblocks.optim.AdamW())."
            )
        return self._backend

    # ------------------------------------------------------------ parameters
    def parameter_names(self, trainable_only: bool = False) -> list[str]:
        """Names of the parameters in the checkpoint state, sorted."""
        names = [
            n for n in self._backend.parameter_names() if not n.startswith(EXTRA_PREFIX)
        ]  # no EMA tensors
        if trainable_only:
            names = [n for n in names if self._backend.is_trainable(n)]
        return names

    def is_trainable(self, name: str) -> bool:
        """True when parameter ``name`` is trained (False: frozen)."""
        self._check_parameter(name)
        return self._backend.is_trainable(name)

    def get_parameter(self, name: str) -> np.ndarray:
        """A copy of parameter ``name`` as a numpy array.

        Raises:
            UnknownNameError: if there is no such parameter.
        """
        self._check_parameter(name)
        return self._backend.get_parameter(name)

    def parameters(self, trainable_only: bool = False) -> dict[str, np.ndarray]:
        """Copies of all parameters (or only the trainable ones), by name."""
        return {n: self.get_parameter(n) for n in self.parameter_names(trainable_only)}

    def gradients(self) -> dict[str, np.ndarray]:
        """Copies of the accumulated gradients of the trainable parameters, by name.

        After :meth:`optimizer_step` / :meth:`lazy_reset_grad` the buffers keep
        their old values until the next ``train_step`` resets them. Empty before
        the first ``train_step`` and, on the portable backend, after a fused
        :meth:`train_and_update` (which keeps no gradients).
        """
        out = {}
        for name in self.parameter_names(trainable_only=True):
            grad = self._backend.gradient(name)
            if grad is not None:
                out[name] = grad
        return out

    def set_gradients(self, values: Mapping[str, Any]) -> None:
        """Overwrite the accumulated gradients of trainable parameters before :meth:`optimizer_step`
        applies them.

        Raises:
            StateError: when no ``train_step`` ran since the gradients were last reset.
            UnknownNameError: if a name is not a trainable parameter.
            ValueError: if a dtype or shape differs from the parameter's.
        """
        if self._pending == 0:
            raise StateError(
                "set_gradients: no train_step ran since the gradients were last reset; run one "
                "first."
            )
        checked = {}
        for name, raw in values.items():
            self._check_parameter(name)
            if not self._backend.is_trainable(name):
                raise UnknownNameError(f"'{name}' is a frozen parameter: it has no gradient.")
            array = np.ascontiguousarray(raw)
            want_dtype, want_shape = self._backend.parameter_spec(name)
            if array.dtype != want_dtype or array.shape != want_shape:
                raise InvalidValueError(
                    f"the gradient of '{name}' is {want_dtype} with shape {want_shape}; got "
                    f"{array.dtype} with "
                    f"shape {array.shape}."
                )
            checked[name] = array
        self._backend.write_gradients(checked)

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
        checked = {}
        for name, raw in values.items():
            self._check_parameter(name)
            array = np.ascontiguousarray(raw)
            want_dtype, want_shape = self._backend.parameter_spec(name)
            if array.dtype != want_dtype or array.shape != want_shape:
                raise InvalidValueError(
                    f"parameter '{name}' is {want_dtype} with shape {want_shape}; got "
                    f"{array.dtype} with shape "
                    f"{array.shape}. Pass an array of the parameter's dtype and shape."
                )
            checked[name] = array
        self._backend.write_parameters(checked)

    def _check_parameter(self, name: str) -> None:
        if not self._backend.has_parameter(name):
            names = self.parameter_names()
            raise UnknownNameError(
                f"'{name}' is not a parameter of the checkpoint.{did_you_mean(name, names)} "
                f"Parameters: {preview(names)}."
            )

    @property
    def num_parameters(self) -> int:
        """Number of trainable elements (as ONNX Runtime counts them)."""
        return self._backend.num_parameters()

    # ----------------------------------------------------------- checkpoints
    def _raw_properties(self) -> dict[str, Any]:
        return {n: _props.decode(v) for n, v in self._backend.properties().items()}

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
        return self._save(_guards.as_path(path, "path"), include_optimizer_state, user)

    def _save(self, path: Path, include_optimizer_state: bool, values: Mapping[str, Any]) -> Path:
        encoded = {name: _props.encode(value, name) for name, value in values.items()}
        encoded[STEP_PROPERTY] = self.step
        ema = ema_property(self.weight_ema)
        if ema is not None or EMA_PROPERTY in self._backend.properties():
            encoded[EMA_PROPERTY] = _props.encode(ema, EMA_PROPERTY)
        for name, value in encoded.items():
            self._backend.set_property(name, value)
        stale = any(n.startswith(EMA_PREFIX) for n in self._backend.parameter_names())
        with _guards.checkpoint_output(
            path
        ) as temp:  # with <temp>.data, if any, replaces the old pair at once
            self._backend.save(temp, include_optimizer_state)
            if (
                ema is not None or stale
            ):  # the average as frozen tensors ONNX Runtime loads and ignores
                write_ema_tensors(temp, self.weight_ema)
        return path

    def set_properties(self, properties: Mapping[str, Any]) -> None:
        """Store properties in the in-memory state (saved with the next checkpoint)."""
        _props.check_names(properties)
        for name, value in properties.items():
            self._backend.set_property(name, _props.encode(value, name))

    # --------------------------------------------------------------- export
    def default_inference_outputs(self) -> list[str]:
        """The outputs :meth:`export_inference_model` keeps by default.

        These are the eval model's outputs after the loss, i.e. the
        ``additional_output_names`` the artifacts were generated with.
        """
        outputs = self.eval_output_names[1:]
        model_outputs = forward_outputs_hint(self.files.eval_model)
        return model_outputs or outputs

    def export_inference_model(
        self,
        path: str | os.PathLike,
        output_names: Sequence[str] | None = None,
        *,
        use_ema: bool = False,
        merge_adapters: bool = False,
    ) -> Path:
        """Write an inference model with the current (trained) parameters.

        The eval model is cut down to the nodes that compute ``output_names``;
        the loss and label inputs are dropped. The export is self-contained on
        both backends and at any size: one ``.onnx`` file, or, when the weights
        total 1 GiB or more (or the eval model keeps constants in external data),
        the ``.onnx`` file and ``<file name>.data`` beside it, referenced by a
        relative location. Both are written atomically; nothing refers back to
        the artifacts directory.

        Args:
            path: Destination ``.onnx`` file.
            output_names: Outputs to keep; default :meth:`default_inference_outputs`.
            use_ema: Export the weight EMA (:attr:`weight_ema`: a ``WeightEMA`` of ``fit``, or the
            one the
                loaded checkpoint holds) instead of the trained weights.
            merge_adapters: For artifacts with LoRA adapters (docs/lora.md): write a plain model
            with
                each adapted weight replaced by ``W + (lora_alpha / r) * B @ A`` (in the weight's
                stored
                layout and dtype) and the adapter branches removed, as PEFT's
                ``merge_and_unload()``.
                False (default) keeps the branches, with the current adapters as initializers, so
                they stay swappable.

        Returns:
            The path written.

        Raises:
            RuntimeError: if the artifacts have no eval model, or ``use_ema`` without a weight EMA.
            TypeError: if ``output_names`` is a str (one name: pass ``[name]``) or holds a non-str.
            ValueError: if no output names are given and none can be inferred, the
                eval model computes no value of that name, or ``merge_adapters`` is asked of
                artifacts without LoRA adapters.
        """
        if not self.has_eval_model:
            raise StateError(
                "export_inference_model needs the eval model, but the artifacts have none."
            )
        if output_names is not None and (
            not isinstance(output_names, (list, tuple))
            or not all(isinstance(n, str) for n in output_names)
        ):
            one = (
                f" For one output pass [{output_names!r:.40}]."
                if isinstance(output_names, str)
                else ""
            )
            raise InvalidTypeError(
                f"export_inference_model: output_names must be a list of output names (str), not "
                f"{type(output_names).__name__} {output_names!r:.60}.{one}"
            )
        if not isinstance(merge_adapters, bool):
            raise InvalidTypeError(
                f"merge_adapters must be True or False, not {merge_adapters!r:.40}."
            )
        merge = merge_adapters
        names = list(output_names) if output_names is not None else self.default_inference_outputs()
        assert (
            self.files.eval_model is not None
        )  # export_inference refuses an empty `names`, saying what to pass
        backend = self._backend
        specs = {n: backend.parameter_spec(n) for n in self.parameter_names()}
        if not use_ema:
            return export_inference(
                self.files.eval_model,
                Path(path),
                names,
                specs,
                backend.get_parameter,
                self.eval_output_names,
                merge,
            )
        if self.weight_ema is None or self.weight_ema.average is None:
            raise StateError(
                "export_inference_model(use_ema=True): the session holds no weight EMA. Train with "
                "fit(..., callbacks=[WeightEMA(decay)]) or load a checkpoint saved from such a run."
            )
        with self.weight_ema.applied(self):
            return export_inference(
                self.files.eval_model,
                Path(path),
                names,
                specs,
                backend.get_parameter,
                self.eval_output_names,
                merge,
            )

    # ------------------------------------------------------------ adapters
    @property
    def lora(self) -> LoraInfo | None:
        """The artifacts' LoRA adapters (:class:`onnxblocks.peft.LoraInfo`), or None without
        them.
        """
        if self._lora is _UNREAD:
            self._lora = artifact_lora(self.files)
        return self._lora  # type: ignore[return-value]

    def _require_lora(self, what: str) -> LoraInfo:
        info = self.lora
        if info is None:
            raise StateError(
                f"{what}: the artifacts in '{self.files.directory}' have no LoRA adapters. "
                "Generate them with "
                "generate_artifacts(..., lora=onnxblocks.peft.LoraConfig(...)) (docs/lora.md)."
            )
        return info

    def save_adapters(self, directory: str | os.PathLike) -> Path:
        """Write the current LoRA adapters as a PEFT directory that
        ``peft.PeftModel.from_pretrained`` loads.

        ``adapter_model.safetensors`` (``base_model.model.<module>.lora_A.weight`` ``[r, in]`` and
        ``lora_B.weight`` ``[out, r]``) and ``adapter_config.json`` are written by onnxblocks itself
        (no torch, no peft), each beside its destination and renamed into place.

        Args:
            directory: The directory (created if missing).

        Returns:
            The directory.

        Raises:
            StateError: if the artifacts have no LoRA adapters.
            NotAFolderError: if ``directory`` is a file.
        """
        from onnxblocks.peft.files import write_adapters

        info = self._require_lora("save_adapters")
        target = _guards.as_path(directory, "directory")
        return write_adapters(
            target, info, {name: self.get_parameter(name) for name in info.adapter_names}
        )

    def load_adapters(self, directory: str | os.PathLike) -> None:
        """Replace the LoRA adapters with those of a PEFT directory (saved by :meth:`save_adapters`
        or ``peft``).

        The directory's ``adapter_config.json`` must fit the artifacts (same ``r`` and scale
        ``lora_alpha / r``, no option onnxblocks does not support) and its
        ``adapter_model.safetensors``
        hold exactly the adapters of the artifacts' target modules (F32, F16 or BF16, read as
        float32);
        nothing is written unless all of it does. The optimizer state is kept (zero in fresh
        artifacts).

        Args:
            directory: The PEFT adapter directory.

        Raises:
            StateError: if the artifacts have no LoRA adapters.
            FileMissingError: if the directory or one of its two files is missing.
            InvalidValueError: for a config or a tensor that does not fit (the message names the
            file and tensor).
        """
        from onnxblocks.peft.files import read_adapters

        info = self._require_lora("load_adapters")
        self.set_parameters(read_adapters(_guards.as_path(directory, "directory"), info))

    def __repr__(self) -> str:
        return (
            f"TrainingSession('{self.files.directory}', inputs={self.input_names}, "
            f"outputs={self.output_names}, "
            f"parameters={len(self.parameter_names())}, step={self.step}, "
            f"device='{self._device_name}', "
            f"backend='{self.backend}')"
        )
