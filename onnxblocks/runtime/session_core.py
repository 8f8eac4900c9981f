"""What every part of a training session stands on: its artifacts, its backend and their
signature.

:class:`~onnxblocks.runtime.session.TrainingSession` is composed of one class per
concern, each in its own module and each built on :class:`SessionCore`:

* :mod:`onnxblocks.runtime.session`: opening the artifacts and the steps;
* :mod:`onnxblocks.runtime.session_parameters`: parameters and gradients;
* :mod:`onnxblocks.runtime.session_checkpoints`: properties and saved checkpoints;
* :mod:`onnxblocks.runtime.session_export`: the inference model and LoRA adapters.

The core holds the state they share and answers what the artifacts declare (input and
output names, whether there is an eval model, an optimizer, a fused step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import StateError, UnknownNameError, did_you_mean, preview
from onnxblocks.checkpoint.save import EXTRA_PREFIX
from onnxblocks.runtime.artifact_set import ArtifactSet
from onnxblocks.runtime.backend import Backend, BackendName
from onnxblocks.runtime.checkpoint_extras import WeightAverage
from onnxblocks.runtime.inputs import InputSpec
from onnxblocks.runtime.layout import ArtifactFiles


class SessionCore:
    """The state a training session's parts share, and the artifacts' signature.

    Attributes:
        files: The :class:`~onnxblocks.runtime.layout.ArtifactFiles` in use.
        backend: ``"training"`` or ``"portable"``: the backend in use.
        check_inputs: Whether batches are checked before ONNX Runtime runs them.
        gradient_reducer: Called with the session by ``optimizer_step`` before the
            parameters are updated (data-parallel training all-reduces the gradients
            there: ``onnxblocks.torch.distributed``); None: nothing.
        weight_ema: The weight average the session's checkpoints hold (a
            ``onnxblocks.runtime.WeightEMA`` attached by it in ``fit``, or the average
            restored from a checkpoint that holds one); None: none.
    """

    files: ArtifactFiles
    backend: BackendName
    check_inputs: bool
    # called with the TrainingSession, which this module cannot name (it imports this one)
    gradient_reducer: Callable[[Any], None] | None
    weight_ema: WeightAverage | None
    _artifacts: ArtifactSet
    _impl: Backend | None
    _device_name: str
    _step: int
    _pending: int
    _train_specs: list[InputSpec]

    @property
    def _backend(self) -> Backend:
        assert self._impl is not None
        return self._impl

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

    @property
    def step(self) -> int:
        """Number of optimizer steps taken (restored from checkpoints, saved with them)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        # an int in [0, 2**53 - 1]: refused here, not at the next step
        self._step = _hyper.step(value, "step")

    def _require_optimizer(self) -> Backend:
        if not self._backend.has_optimizer:
            raise StateError(
                f"The artifacts in '{self.files.directory}' have no optimizer model; regenerate "
                "them with optimizer=... (e.g. onnxblocks.optim.AdamW())."
            )
        return self._backend

    # ------------------------------------------------------------ parameters
    def parameter_names(self, trainable_only: bool = False) -> list[str]:
        """Names of the parameters in the checkpoint state, sorted."""
        # no extras (a weight average's tensors)
        names = [n for n in self._backend.parameter_names() if not n.startswith(EXTRA_PREFIX)]
        if trainable_only:
            names = [n for n in names if self._backend.is_trainable(n)]
        return names

    def _check_parameter(self, name: str) -> None:
        if not self._backend.has_parameter(name):
            names = self.parameter_names()
            raise UnknownNameError(
                f"'{name}' is not a parameter of the checkpoint.{did_you_mean(name, names)} "
                f"Parameters: {preview(names)}."
            )
