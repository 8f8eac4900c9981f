"""The optimizer-model contract ONNX Runtime's training API expects, shared by AdamW and SGD.

An optimizer model is a small graph that ONNX Runtime's ``Optimizer`` runs once
per ``optimizer_step()``. Its graph inputs are, by name:

==========================  ===========================  ====================================
input                       type                         what ONNX Runtime feeds
==========================  ===========================  ====================================
``learning_rate``           float ``[1]``                the current learning rate
``step``                    int64 ``[1]``                the update count, 1 for the first step
``params``                  sequence of tensors          the trainable parameters
``gradients``               sequence of tensors          their accumulated gradients
``first_order_moments``     sequence of tensors          optimizer state (zeros at the start)
``second_order_moments``    sequence of tensors          optimizer state (AdamW only)
==========================  ===========================  ====================================

and its one output is the bool ``[1]`` flag the update op returns. ONNX Runtime
checks the input names (SGD too must declare ``step`` and
``first_order_moments``, even though it does not use them) and updates the
sequences in place.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx

# the optimizer model's input names (re-exported: the contract of onnxblocks._core.contracts)
from onnxblocks._core.contracts import FIRST_ORDER_MOMENTS as FIRST_ORDER_MOMENTS
from onnxblocks._core.contracts import GRADIENTS as GRADIENTS
from onnxblocks._core.contracts import LEARNING_RATE as LEARNING_RATE
from onnxblocks._core.contracts import PARAMS as PARAMS
from onnxblocks._core.contracts import SECOND_ORDER_MOMENTS as SECOND_ORDER_MOMENTS
from onnxblocks._core.contracts import STEP as STEP
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.block import ForwardBlock
from onnxblocks.blocks.value import Value
from onnxblocks.optim.clip import ClipGradNorm

if TYPE_CHECKING:
    from onnxblocks.portable.optimizer_spec import OptimizerSpec

#: Parameter element types the optimizer ops accept.
FLOAT_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
}


def as_clip(clip_grad: ClipGradNorm | float | None) -> ClipGradNorm | None:
    """Accept a :class:`ClipGradNorm`, a max norm, or None.

    Raises:
        TypeError: for anything else.
    """
    if clip_grad is None or isinstance(clip_grad, ClipGradNorm):
        return clip_grad
    if isinstance(clip_grad, (int, float)) and not isinstance(clip_grad, bool):
        return ClipGradNorm(clip_grad)
    raise InvalidTypeError(
        "clip_grad must be a ClipGradNorm block, a max norm (float) or None, not "
        f"{type(clip_grad).__name__}."
    )


def parameter_elem_type(parameters: Any) -> int:
    """The element type shared by the trainable parameters of ``parameters = (trainable, frozen)``.

    Raises:
        TypeError: if ``parameters`` is not a (trainable, frozen) pair of sequences of
            objects with ``name`` and ``data_type``.
        ValueError: if there are no trainable parameters, or they do not share one
            float element type.
    """
    if not (isinstance(parameters, (tuple, list)) and len(parameters) == 2):
        raise InvalidTypeError(
            "parameters must be a (trainable, frozen) pair of sequences of parameters "
            "(onnx.TensorProto or "
            f"onnxblocks TensorSource), not {type(parameters).__name__}. Pass the pair returned "
            "by the artifact "
            "builder, e.g. (trainable_params, frozen_params)."
        )
    trainable = parameters[0]
    if isinstance(trainable, (str, bytes)) or not isinstance(trainable, Sequence):
        raise InvalidTypeError(
            f"The trainable parameters must be a sequence, not {type(trainable).__name__}."
        )
    if not trainable:
        raise InvalidValueError(
            "An optimizer needs at least one trainable parameter, but the trainable list is empty. "
            "Mark some parameters as requiring gradients."
        )
    first: tuple[str, int] | None = None
    for param in trainable:
        name, data_type = getattr(param, "name", None), getattr(param, "data_type", None)
        if not isinstance(name, str) or not isinstance(data_type, int):
            raise InvalidTypeError(
                "Each trainable parameter needs a str .name and an int .data_type "
                "(onnx.TensorProto or "
                f"TensorSource); got {type(param).__name__}."
            )
        if data_type not in FLOAT_TYPES:
            dtype = (
                onnx.TensorProto.DataType.Name(data_type)
                if data_type in onnx.TensorProto.DataType.values()
                else str(data_type)
            )
            raise InvalidValueError(
                f"Trainable parameter '{name}' has element type {dtype}; the optimizer ops "
                "update only "
                f"{sorted(FLOAT_TYPES.values())} parameters. Freeze it (move it to the frozen "
                "list) or cast it."
            )
        if first is None:
            first = (name, data_type)
        elif data_type != first[1]:
            raise InvalidValueError(
                f"Trainable parameters must share one element type, but '{first[0]}' is "
                f"{FLOAT_TYPES[first[1]]} "
                f"and '{name}' is {FLOAT_TYPES[data_type]}. Cast them to one type, or freeze one "
                "of them."
            )
    assert first is not None
    return first[1]


def spec_type() -> type[OptimizerSpec]:
    """:class:`~onnxblocks.portable.optimizer_spec.OptimizerSpec`, imported on first use
    (``import onnxblocks`` skips onnx-ir).
    """
    import onnxblocks.ir.lazy  # noqa: F401  # first: onnx-ir's sympy loads only if computed with
    from onnxblocks.portable.optimizer_spec import OptimizerSpec

    return OptimizerSpec


def sequence_input(acc: ModelAccessor, name: str, elem_type: int) -> Value:
    """Add a graph input ``name`` holding a sequence of ``elem_type`` tensors, or reuse it.

    Raises:
        ValueError: if ``name`` is already a value that is not such a graph input.
    """
    if acc.has_value(name):
        existing = acc.type_of(name) if name in acc.input_names() else None
        if existing is not None and existing.WhichOneof("value") == "sequence_type":
            return Value(name)
        raise InvalidValueError(
            f"{acc.where()}the optimizer needs a graph input '{name}' (a sequence of tensors), "
            "but the model "
            "already has a different value of that name. Build optimizers with "
            "onnxblocks.empty_base()."
        )
    return acc.add_typed_input(onnx.helper.make_tensor_sequence_value_info(name, elem_type, None))


class Optimizer(ForwardBlock):
    """Base class of the optimizer-model blocks (:class:`~onnxblocks.optim.AdamW`,
    :class:`~onnxblocks.optim.SGD`).

    Call the block with ``(trainable, frozen)`` parameters inside
    ``with onnxblocks.empty_base():``; then :meth:`to_model_proto` returns the
    optimizer model. Only the trainable parameters' element type is read.

    Args:
        clip_grad: Clip the gradients' global norm before the update: a
            :class:`ClipGradNorm`, a max norm, or None.
    """

    #: Sequence inputs after ``params`` and ``gradients`` (optimizer state).
    state_inputs: tuple[str, ...] = (FIRST_ORDER_MOMENTS,)
    #: The standard-op optimizer that builds this block's model where ONNX Runtime's kernel
    #: cannot (e.g. AdamW with amsgrad or parameter groups), else None.
    standard: Optimizer | None = None

    def __init__(self, clip_grad: ClipGradNorm | float | None = None) -> None:
        super().__init__()
        self.clip_grad = as_clip(clip_grad)
        self._spec_inputs: tuple[tuple[Any, ...], int] | None = None

    @property
    def max_norm(self) -> float | None:
        """The global gradient-clipping norm, or None."""
        return self.clip_grad.max_norm if self.clip_grad is not None else None

    @property
    def optimizer_spec(self) -> OptimizerSpec | None:
        """What the optimizer model built last does, or None before it is built.

        The training build's model is written from it, and portable artifacts'
        optimizer and step models take it (nothing reads it back from the graph).
        """
        return self.spec(*self._spec_inputs) if self._spec_inputs is not None else None

    @abstractmethod
    def spec(self, trainable: Sequence[Any], elem_type: int) -> OptimizerSpec:
        """The optimizer for these trainable parameters (objects with ``name``) of
        ``elem_type``.
        """

    def build(self, parameters: Any) -> Value:
        """Declare the optimizer inputs, clip the gradients if asked, add the update, return its
        flag.

        Args:
            parameters: ``(trainable, frozen)``: sequences of ``onnx.TensorProto`` or
                TensorSource; the trainable ones share one float element type.
        """
        if self.standard is not None:
            out = self.standard.build(parameters)
            self._spec_inputs = self.standard._spec_inputs
            return out
        acc = self.accessor
        elem_type = parameter_elem_type(parameters)
        self._spec_inputs = (tuple(parameters[0]), elem_type)
        learning_rate = acc.add_input(LEARNING_RATE, onnx.TensorProto.FLOAT, [1])
        step = acc.add_input(STEP, onnx.TensorProto.INT64, [1])
        params = sequence_input(acc, PARAMS, elem_type)
        gradients = sequence_input(acc, GRADIENTS, elem_type)
        states = [sequence_input(acc, name, elem_type) for name in self.state_inputs]
        if self.clip_grad is not None:
            gradients = self.clip_grad(gradients)
        return self.update(learning_rate, step, params, gradients, states)

    @abstractmethod
    def update(
        self,
        learning_rate: Value,
        step: Value,
        params: Value,
        gradients: Value,
        states: list[Value],
    ) -> Value:
        """Add the update node(s) and return the bool ``[1]`` updated flag."""
