"""The training-build backend: ONNX Runtime's training API (``Module``, ``Optimizer``,
``CheckpointState``).

It drives the C bindings of the training build (``onnxruntime.capi._pybind_state``
of ``onnxruntime-training``), never ``onnxruntime.training`` (which imports
torch). Parameters, gradients and moments live in ONNX Runtime's
``CheckpointState``; checkpoints are ONNX Runtime's own ``save_checkpoint``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxblocks._core.errors import InvalidValueError, preview
from onnxblocks.checkpoint.save import EXTRA_PREFIX
from onnxblocks.runtime import _ort
from onnxblocks.runtime.artifact_set import ArtifactSet, CheckpointRead
from onnxblocks.runtime.backend import BackendName
from onnxblocks.runtime.optimizer_driver import StandardOptimizerDriver, standard_optimizer_order


class OrtOptimizer:
    """ONNX Runtime's training ``Optimizer`` with the interface of the runtime's own driver
    (:class:`~onnxblocks.runtime.optimizer_driver.StandardOptimizerDriver`): one executor kind.

    Its state lives in ONNX Runtime's ``CheckpointState``, which ``save_checkpoint`` writes.
    """

    saved_by_onnxruntime = True

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer
        self.optimizer_step = optimizer.optimizer_step

    @property
    def learning_rate(self) -> float:
        """The learning rate the next step takes."""
        return float(self._optimizer.get_learning_rate())

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._optimizer.set_learning_rate(value)

    def add_state(self, path: Path) -> None:
        """Nothing to add: ONNX Runtime wrote the state with the checkpoint."""


def _ort_failure(exc: BaseException) -> bool:
    """True for what ONNX Runtime's training bindings raise when a run fails (their classes, or a
    RuntimeError).
    """
    return _ort.is_ort_error(exc) or type(exc) is RuntimeError


class TrainingBuildBackend:
    """A training-build ``Module`` + ``Optimizer`` over one checkpoint state (see
    :class:`~.backend.Backend`).
    """

    name: BackendName = "training"

    def __init__(self, artifacts: ArtifactSet, device: str, options: Any) -> None:
        files = self.files = artifacts.files
        self._optimizer_model = artifacts.optimizer
        self._C = _ort.require_training_build(f"Training the artifacts in '{files.directory}'")
        self._device = _ort.make_device(device)
        frozen = (
            files.base_weights is not None
        )  # no folded copies of the memory-mapped base (runtime/_ort.py)
        self._options = (
            options if options is not None else _ort.session_options(runs=True, frozen_base=frozen)
        )
        self._state: Any = None
        self.has_fused_step = False
        # the eval model's session opens on the first eval step (a training step never runs it),
        # over the parameters of the checkpoint state, as ONNX Runtime's Module feeds them; an
        # .ort eval model has no signature to read before a session opens, so Module opens it
        self._eval_signature = artifacts.eval.signature if artifacts.eval is not None else None
        self._eager_eval = files.eval_model is not None and self._eval_signature is None
        self._eval: Any = None
        self._eval_parameters: list[str] = []
        self._providers = _ort.providers(device)
        self.load(artifacts.checkpoint)

    # ------------------------------------------------------------- loading
    def load(self, read: CheckpointRead) -> None:
        # the models fit the checkpoint and each other: the artifact set checked them
        C, checkpoint = self._C, read.path
        try:
            state = C.load_checkpoint(os.fspath(checkpoint))
        except RuntimeError as exc:
            raise InvalidValueError(
                f"Cannot read checkpoint '{checkpoint}': {_ort.clean_message(exc)}"
            ) from None
        if self._state is not None:
            # a weight EMA (EXTRA_PREFIX tensors) may come or go: the model's parameters must stay
            before, after = (
                {n for n in st.parameter_names() if not n.startswith(EXTRA_PREFIX)}
                for st in (self._state, state)
            )
            if before != after:
                raise InvalidValueError(
                    f"Checkpoint '{checkpoint}' holds parameters {preview(sorted(after))}, but "
                    "the session has "
                    f"{preview(sorted(before))}. Load a checkpoint saved from these artifacts."
                )
        eval_model = self.files.eval_model if self._eager_eval else None
        eval_path = os.fspath(eval_model) if eval_model is not None else None
        try:
            module = C.Module(
                os.fspath(self.files.training_model), state, eval_path, self._device, self._options
            )
        except RuntimeError as exc:
            raise InvalidValueError(
                f"ONNX Runtime cannot load the training model '{self.files.training_model}' with "
                "checkpoint "
                f"'{checkpoint}': {_ort.clean_message(exc)}. Check that the checkpoint belongs "
                "to these artifacts."
            ) from None
        optimizer: OrtOptimizer | StandardOptimizerDriver | None = None
        if self.files.optimizer_model is not None:
            model = self._optimizer_model.model if self._optimizer_model is not None else None
            order = standard_optimizer_order(self.files.optimizer_model, model)
            if (
                order is not None
            ):  # an optimizer in standard ops: the runtime drives it (optimizer_driver.py)
                optimizer = StandardOptimizerDriver(
                    self.files.optimizer_model,
                    order,
                    state,
                    checkpoint,
                    C,
                    read.contents().optimizer_state,
                )
            else:
                optimizer = OrtOptimizer(
                    C.Optimizer(
                        os.fspath(self.files.optimizer_model), state, self._device, self._options
                    )
                )
        self._state, self._module, self._optimizer = state, module, optimizer
        self.train_inputs = list(module.input_names(True))
        self.train_outputs = list(module.output_names(True))
        if eval_path is not None:
            self.eval_inputs = list(module.input_names(False))
            self.eval_outputs = list(module.output_names(False))
        else:  # Module's split: an input the state holds is a parameter, the rest the user's
            names = list(self._eval_signature.inputs) if self._eval_signature else []
            self._eval_parameters = [n for n in names if state.has_parameter(n)]
            self.eval_inputs = [n for n in names if not state.has_parameter(n)]
            self.eval_outputs = list(self._eval_signature.outputs) if self._eval_signature else []
        self.has_optimizer = optimizer is not None
        # bound methods: the hot path calls them without attribute lookups
        self._train = module.train_step
        self._reset = module.lazy_reset_grad
        self._vector = C.OrtValueVector
        self._update = optimizer.optimizer_step if optimizer is not None else None

    # --------------------------------------------------------------- steps
    def train_step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        fetches = self._vector()
        try:
            self._train(arrays, fetches)
        except (
            Exception
        ) as exc:  # ONNX Runtime's exceptions; translated once, as the other backends do
            if not _ort_failure(exc):
                raise
            raise _ort.run_error(exc, "the training model") from None
        return tuple(f.numpy() for f in fetches)

    def eval_step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        if self._eager_eval:
            fetches = self._vector()
            try:
                self._module.eval_step(arrays, fetches)
            except Exception as exc:
                if not _ort_failure(exc):
                    raise
                raise _ort.run_error(exc, "the eval model") from None
            return tuple(f.numpy() for f in fetches)
        session = self._eval_session()
        cpu, value = _ort.make_device("cpu"), self._C.OrtValue.ortvalue_from_numpy
        kept = [np.ascontiguousarray(a) for a in arrays]  # alive while the run reads them
        feeds = {n: value(a, cpu) for n, a in zip(self.eval_inputs, kept, strict=True)}
        for name in self._eval_parameters:  # the state's own buffers: no copy
            feeds[name] = self._state.get_parameter(name).data
        try:
            fetches = session._sess.run_with_ort_values(
                feeds, self.eval_outputs, _ort.run_options()
            )
        except Exception as exc:
            if not _ort_failure(exc):
                raise
            raise _ort.run_error(exc, "the eval model") from None
        return tuple(f.numpy() for f in fetches)

    def _eval_session(self) -> Any:
        """The eval model's session, opened on first use with the training model's options."""
        if self._eval is None:
            assert self.files.eval_model is not None  # the session checked there is one
            ort, path = _ort.onnxruntime(), os.fspath(self.files.eval_model)
            try:  # Module turns pre-packing off in the options it is given; as its eval session
                self._options.get_session_config_entry(_ort.NO_PREPACKING[0])
            except RuntimeError:
                self._options.add_session_config_entry(*_ort.NO_PREPACKING)
            try:
                opened = ort.InferenceSession(
                    path, sess_options=self._options, providers=self._providers
                )
            except Exception as exc:
                raise InvalidValueError(
                    f"ONNX Runtime cannot load the eval model '{path}': "
                    f"{_ort.clean_message(exc)}. Regenerate the artifacts (generate_artifacts "
                    "writes eval_model.onnx with the training model)."
                ) from None
            self._eval = opened
        return self._eval

    def optimizer_step(self) -> None:
        assert self._update is not None
        try:
            self._update()
        except Exception as exc:
            if not _ort_failure(exc):
                raise
            raise _ort.run_error(exc, "the optimizer model") from None

    def lazy_reset_grad(self) -> None:
        self._reset()

    def step(self, arrays: Sequence[Any]) -> tuple[np.ndarray, ...]:
        fetches = self._vector()
        try:
            self._train(arrays, fetches)
            self._update()  # type: ignore[misc]  # the session checked that there is an optimizer
            self._reset()
        except Exception as exc:
            if not _ort_failure(exc):
                raise
            raise _ort.run_error(exc, "a training step") from None
        return tuple(f.numpy() for f in fetches)

    def get_learning_rate(self) -> float:
        assert self._optimizer is not None
        return float(np.float32(self._optimizer.learning_rate))

    def set_learning_rate(self, value: float) -> None:
        assert self._optimizer is not None
        self._optimizer.learning_rate = value

    # ---------------------------------------------------------- parameters
    def parameter_names(self) -> list[str]:
        return sorted(self._state.parameter_names())

    def has_parameter(self, name: str) -> bool:
        return bool(self._state.has_parameter(name))

    def is_trainable(self, name: str) -> bool:
        return bool(self._state.get_parameter(name).requires_grad)

    def get_parameter(self, name: str) -> np.ndarray:
        return np.array(self._state.get_parameter(name).data.numpy(), copy=True)

    def parameter_spec(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
        data = self._state.get_parameter(name).data  # its element type, not its values: no copy
        return onnx.helper.tensor_dtype_to_np_dtype(data.element_type()), tuple(data.shape())

    def write_parameters(self, values: dict[str, np.ndarray]) -> None:
        cpu = _ort.make_device("cpu")
        for name, array in values.items():
            self._state.copy_parameter_from(name, self._C.OrtValue.ortvalue_from_numpy(array, cpu))

    def gradient(self, name: str) -> np.ndarray | None:
        grad = self._state.get_parameter(name).grad
        return np.array(grad.numpy(), copy=True) if grad.has_value() else None

    def write_gradients(self, values: dict[str, np.ndarray]) -> None:
        for (
            name,
            array,
        ) in values.items():  # the state's gradient buffer, which the optimizer model reads
            self._state.get_parameter(name).grad.update_inplace(array)

    def num_parameters(self) -> int:
        return int(self._module.get_parameters_size(True))

    # --------------------------------------------------------- checkpoints
    def properties(self) -> dict[str, int | float | str]:
        return {n: self._state.get_property(n) for n in self._state.property_names()}

    def set_property(self, name: str, value: int | float | str) -> None:
        self._state.add_property(name, value)

    def save(self, path: Path, include_optimizer_state: bool) -> None:
        optimizer = self._optimizer if include_optimizer_state else None
        in_state = optimizer is not None and optimizer.saved_by_onnxruntime
        self._C.save_checkpoint(self._state, os.fspath(path), in_state)
        if optimizer is not None:
            optimizer.add_state(path)
