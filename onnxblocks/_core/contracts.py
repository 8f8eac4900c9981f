"""Names that two parts of onnxblocks, or onnxblocks and ONNX Runtime, must agree on; defined once.

* **Gradient and accumulation names** (ONNX Runtime's training API ``Module``
  recognises the buffers by their suffix and ``lazy_reset_grad`` by its name):
  ``<param>_grad``, ``<param>_grad.accumulation.buffer``, ``<param>_grad.accumulation.out``.
* **Optimizer model inputs** (ONNX Runtime's ``Optimizer`` feeds them by name):
  ``learning_rate``, ``step``, ``params``, ``gradients``, ``first_order_moments``,
  ``second_order_moments``.
* **Artifact file names**: what :func:`onnxblocks.artifacts.generate_artifacts`
  writes and :mod:`onnxblocks.runtime` and the displays look for.

Everything else imports these; no other module spells them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ---------------------------------------------------------------- gradients
#: Suffix of a value's gradient.
GRADIENT_SUFFIX = "_grad"
#: Suffix (after the gradient name) of a parameter's accumulation buffer input.
BUFFER_SUFFIX = ".accumulation.buffer"
#: Suffix (after the gradient name) of a parameter's accumulator flag output.
ACCUMULATED_SUFFIX = ".accumulation.out"
#: Name of the bool input that makes the accumulators overwrite instead of add.
LAZY_RESET_GRAD = "lazy_reset_grad"
#: Name prefix of an ``Identity`` node that stops the gradient: while ONNX Runtime builds the
#: gradient its readers read a graph input instead (``onnxblocks.gradient.stop_gradient``); it
#: computes as an ``Identity`` everywhere else. The chunked losses write it.
STOP_GRADIENT_NODE = "onnxblocks.stop_gradient"

_GRADIENT_VALUE = re.compile(re.escape(GRADIENT_SUFFIX) + r"($|[./:])")
#: ``<value>_grad`` or ``<value>_grad_<n>`` (ONNX Runtime's partial gradients): the gradient of
#: ``<value>`` (the match's group ``value``).
GRADIENT_OF = re.compile(r"^(?P<value>.+)" + re.escape(GRADIENT_SUFFIX) + r"(_\d+)?$")


def gradient_name(name: str) -> str:
    """Name of the gradient of ``name``: ``<name>_grad``."""
    return f"{name}{GRADIENT_SUFFIX}"


def gradient_of(name: str) -> str | None:
    """The value whose gradient ``name`` is (``x`` for ``x_grad`` and ``x_grad_1``), or None."""
    match = GRADIENT_OF.match(name)
    return match.group("value") if match else None


def buffer_name(param: str) -> str:
    """Name of the accumulation buffer input of a parameter:
    ``<param>_grad.accumulation.buffer``.
    """
    return f"{gradient_name(param)}{BUFFER_SUFFIX}"


def accumulated_name(param: str) -> str:
    """Name of the accumulator's flag output of a parameter: ``<param>_grad.accumulation.out``."""
    return f"{gradient_name(param)}{ACCUMULATED_SUFFIX}"


def is_gradient_value(name: str) -> bool:
    """True for a gradient value's name (``x_grad``, or names ORT derives from it:
    ``x_grad/...``).
    """
    return _GRADIENT_VALUE.search(name) is not None


def is_accumulation_value(name: str) -> bool:
    """True for an accumulation buffer, an accumulator output, or ``lazy_reset_grad``."""
    return name == LAZY_RESET_GRAD or name.endswith((BUFFER_SUFFIX, ACCUMULATED_SUFFIX))


# ---------------------------------------------------------------- optimizer model
LEARNING_RATE = "learning_rate"
STEP = "step"
PARAMS = "params"
GRADIENTS = "gradients"
FIRST_ORDER_MOMENTS = "first_order_moments"
SECOND_ORDER_MOMENTS = "second_order_moments"
#: The state sequences of an optimizer model, in slot order (AdamW's two moments first, as ONNX
#: Runtime names them).
STATE_SEQUENCES = (
    FIRST_ORDER_MOMENTS,
    SECOND_ORDER_MOMENTS,
    "third_order_moments",
    "fourth_order_moments",
)
#: Optimizer-model metadata key: the algorithm, its parameter groups and hyperparameters (JSON), for
#: the
#: optimizers written in standard ops (``onnxblocks.portable.rules``).
OPTIMIZER_METADATA = "onnxblocks.optimizer"

# ---------------------------------------------------------------- model metadata
#: Eval-model metadata key: the forward model's output names (a JSON list), for inference export.
FORWARD_OUTPUTS_METADATA = "onnxblocks.forward_outputs"
#: Model metadata key of a model with LoRA adapters (docs/lora.md): JSON ``{"config": <PEFT adapter
#: config>,
#: "targets": {<module>: {...}}}``, written by ``onnxblocks.peft.apply_lora`` and copied into every
#: artifact model.
LORA_METADATA = "onnxblocks.lora"

# ---------------------------------------------------------------- portable artifacts
# (docs/portable.md)
#: Model metadata key marking portable artifacts (value ``"1"``): they run on stock onnxruntime.
PORTABLE_METADATA = "onnxblocks.portable"
#: Model metadata key of portable artifacts: their portable mode, ``"standard"`` (standard ONNX ops
#: only) or
#: ``"onnxruntime"`` (also the contrib ops stock onnxruntime runs on CPU).
PORTABLE_MODE_METADATA = "onnxblocks.portable.mode"
#: Suffix of a value's updated copy among a portable model's outputs (``params.out``, ``<p>.out``).
UPDATED_SUFFIX = ".out"
#: Suffixes of a parameter's AdamW moments among the step and optimizer models' inputs.
FIRST_MOMENT_SUFFIX, SECOND_MOMENT_SUFFIX = ".exp_avg", ".exp_avg_sq"

# ---------------------------------------------------------------- optimizer state (ONNX Runtime's
# checkpoint layout)
#: The learning rate ONNX Runtime's ``Optimizer`` starts with (until set, or restored from a
#: checkpoint).
DEFAULT_LEARNING_RATE = 1e-3
#: ONNX Runtime's name for its single optimizer group in a checkpoint.
OPTIMIZER_GROUP = "group0"
#: Checkpoint property holding the number of optimizer steps taken (the session's ``step``).
STEP_PROPERTY = "onnxblocks.step"
#: ONNX Runtime's name of a parameter's state tensor in slot ``k`` of a checkpoint.
CHECKPOINT_MOMENT = "momentum{}"
#: ONNX Runtime's names of a parameter's moments in a checkpoint (first, second).
CHECKPOINT_MOMENTS = ("momentum0", "momentum1")


def checkpoint_moment_name(slot: int) -> str:
    """ONNX Runtime's name of a parameter's state tensor ``slot`` in a checkpoint:
    ``momentum<slot>``.
    """
    return CHECKPOINT_MOMENT.format(slot)


def checkpoint_moment_slot(name: str) -> int | None:
    """The slot of a checkpoint state tensor named ``momentum<slot>``; None for another name."""
    prefix = CHECKPOINT_MOMENT.format("")
    digits = name.removeprefix(prefix) if name.startswith(prefix) else ""
    return int(digits) if digits.isdigit() and digits.isascii() else None


def updated_name(name: str) -> str:
    """Name of the output holding the updated value of input ``name``: ``<name>.out``."""
    return f"{name}{UPDATED_SUFFIX}"


def moment_names(param: str) -> tuple[str, str]:
    """The step and optimizer models' inputs holding a parameter's moments: ``<p>.exp_avg``,
    ``<p>.exp_avg_sq``.
    """
    return f"{param}{FIRST_MOMENT_SUFFIX}", f"{param}{SECOND_MOMENT_SUFFIX}"


#: The most state tensors per parameter an optimizer keeps (Adam with amsgrad: 3; RMSprop centered
#: with momentum: 3).
MAX_STATES = len(STATE_SEQUENCES)


def state_names(param: str, count: int = MAX_STATES) -> tuple[str, ...]:
    """The step and optimizer models' inputs holding a parameter's first ``count`` state tensors, in
    slot order.

    The first two are :func:`moment_names` (``<p>.exp_avg``, ``<p>.exp_avg_sq``); later ones
    ``<p>.state<k>``.
    In a checkpoint, slot ``k`` is ONNX Runtime's ``momentum<k>``.
    """
    return (*moment_names(param), *(f"{param}.state{k}" for k in range(2, MAX_STATES)))[:count]


# ---------------------------------------------------------------- artifact files
TRAINING_MODEL = "training_model"
EVAL_MODEL = "eval_model"
OPTIMIZER_MODEL = "optimizer_model"
#: The fused training step of portable artifacts (forward, backward and optimizer update in one
#: graph).
STEP_MODEL = "step_model"
#: The step model with its trainable parameters and optimizer state as one flat float32 tensor
#: each way (``onnxblocks.web.write_flat_step``; the JavaScript client's fast path).
FLAT_STEP_MODEL = "flat_step_model"
#: The flat step model's state input (its output is ``FLAT_STATE + UPDATED_SUFFIX``) and the
#: metadata key of its layout (JSON ``[[name, offset, shape], ...]``).
FLAT_STATE = "onnxblocks.flat_state"
CHECKPOINT = "checkpoint"
NOMINAL_CHECKPOINT = "nominal_checkpoint"
#: The frozen base weights every model of a set references as external data, stored once
#: (docs/training.md).
BASE_WEIGHTS = "base_weights.bin"
#: Model metadata key naming the element type the frozen base is stored in (absent: as exported).
BASE_DTYPE_METADATA = "onnxblocks.base_dtype"
#: The record of where an artifact set made by ``onnxblocks.hub.from_hub`` came from
#: (``hub/record.py`` writes it beside the artifacts; ``export_hub`` reads it).
HUB_RECORD = "hub.json"
#: Suffix of ONNX models, of ORT-format models, and of external data files.
ONNX_SUFFIX, ORT_SUFFIX, DATA_SUFFIX = ".onnx", ".ort", ".data"
#: The models of a set of artifacts, in display order.
MODEL_STEMS = (TRAINING_MODEL, EVAL_MODEL, OPTIMIZER_MODEL)


@dataclass(frozen=True)
class ArtifactNames:
    """File names of one set of artifacts: ``{prefix}training_model.onnx`` and so on.

    Attributes:
        prefix: The prefix every file name starts with.
    """

    prefix: str = ""

    def model(self, stem: str, ort_format: bool = False) -> str:
        """File name of model ``stem`` (one of :data:`MODEL_STEMS`), ``.onnx`` or ``.ort``."""
        return f"{self.prefix}{stem}{ORT_SUFFIX if ort_format else ONNX_SUFFIX}"

    @property
    def training_model(self) -> str:
        return self.model(TRAINING_MODEL)

    @property
    def eval_model(self) -> str:
        return self.model(EVAL_MODEL)

    @property
    def optimizer_model(self) -> str:
        return self.model(OPTIMIZER_MODEL)

    @property
    def step_model(self) -> str:
        return self.model(STEP_MODEL)

    @property
    def checkpoint(self) -> str:
        return f"{self.prefix}{CHECKPOINT}"

    @property
    def base_weights(self) -> str:
        return f"{self.prefix}{BASE_WEIGHTS}"

    @property
    def nominal_checkpoint(self) -> str:
        return f"{self.prefix}{NOMINAL_CHECKPOINT}"

    def owned(self) -> list[str]:
        """Every file name a set with this prefix may hold.

        That is the models (``.onnx`` and ``.ort``; the portable step model included),
        the checkpoints, the external-data companion (``.data``) of each, and the
        frozen base weights the models share (``base_weights.bin``).
        """
        names = [
            self.model(stem, ort) for stem in (*MODEL_STEMS, STEP_MODEL) for ort in (False, True)
        ]
        names += [self.checkpoint, self.nominal_checkpoint]
        return [n for name in names for n in (name, name + DATA_SUFFIX)] + [self.base_weights]
