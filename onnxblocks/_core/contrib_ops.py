"""The ONNX Runtime contrib ops onnxblocks emits, declared once as data.

onnx knows no schema for the ``com.microsoft`` training ops, so the accessor
cannot check their nodes or infer their output types. Each op is declared here
with its formal inputs, its outputs (and how their types follow from the
inputs), and its typed attributes with ONNX Runtime's defaults. :meth:`ContribOp.emit`
checks a call against the declaration and adds the node to the active build with
the right output types, and :meth:`ContribOp.node` makes a bare NodeProto for graph
surgery outside a build (the gradient accumulation). Nothing else in onnxblocks
spells these op names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from onnxblocks._core import limits as _limits
from onnxblocks._core.active_build import Builder, current
from onnxblocks._core.errors import InvalidTypeError, did_you_mean

_ATTRIBUTE_KINDS: dict[int, str] = {
    onnx.AttributeProto.FLOAT: "float",
    onnx.AttributeProto.INT: "int",
    onnx.AttributeProto.STRING: "string",
}


@dataclass(frozen=True)
class Attribute:
    """One typed attribute of a contrib op.

    Attributes:
        name: The attribute name.
        kind: ``onnx.AttributeProto.FLOAT``, ``INT`` or ``STRING``.
        default: ONNX Runtime's default value.
    """

    name: str
    kind: int
    default: float | int | str

    def coerce(self, op_type: str, value: Any) -> float | int | str:
        """Return ``value`` converted to this attribute's kind.

        Raises:
            TypeError: if ``value`` cannot represent this kind.
        """
        accepted: dict[int, bool] = {
            onnx.AttributeProto.FLOAT: isinstance(value, (int, float))
            and not isinstance(value, bool),
            onnx.AttributeProto.INT: isinstance(value, (bool, int)),
            onnx.AttributeProto.STRING: isinstance(value, str),
        }
        if not accepted[self.kind]:
            raise InvalidTypeError(
                f"{op_type} attribute '{self.name}' must be a {_ATTRIBUTE_KINDS[self.kind]}, "
                f"not {type(value).__name__} ({value!r})."
            )
        if self.kind == onnx.AttributeProto.FLOAT:
            return float(value)
        if self.kind == onnx.AttributeProto.INT:
            return int(value)
        return str(value)


@dataclass(frozen=True)
class Output:
    """One output of a contrib op and where its type comes from.

    Exactly one of ``elem_type`` (a fixed tensor type, with ``shape``) or
    ``like_input`` (the index of the input whose type it has) is set.
    """

    name: str
    elem_type: int | None = None
    shape: tuple[int, ...] | None = None
    like_input: int | None = None

    def type_for(self, acc: Builder, inputs: Sequence[str]) -> onnx.TypeProto | None:
        """The TypeProto of this output given the node's inputs, or None if unknown."""
        if self.elem_type is not None:
            return onnx.helper.make_tensor_type_proto(self.elem_type, self.shape)
        if (
            self.like_input is not None
            and self.like_input < len(inputs)
            and inputs[self.like_input]
        ):
            return acc.type_of(inputs[self.like_input])
        return None


@dataclass(frozen=True)
class ContribOp:
    """Declaration of one ``com.microsoft`` op that onnxblocks emits.

    Attributes:
        op_type: The operator name.
        inputs: Formal input names, in order.
        required_inputs: How many leading inputs must be given.
        outputs: The outputs, in order.
        attributes: The typed attributes with their defaults.
        domain: The operator domain.
    """

    op_type: str
    inputs: tuple[str, ...]
    required_inputs: int
    outputs: tuple[Output, ...]
    attributes: tuple[Attribute, ...] = ()
    domain: str = _limits.MS_DOMAIN

    def attribute(self, name: str) -> Attribute:
        """The declaration of attribute ``name``.

        Raises:
            TypeError: if the op has no such attribute.
        """
        for attr in self.attributes:
            if attr.name == name:
                return attr
        known = [a.name for a in self.attributes]
        raise InvalidTypeError(
            f"{self.op_type} has no attribute '{name}'.{did_you_mean(name, known)} Its "
            f"attributes are {known}."
        )

    def emit(
        self,
        inputs: Sequence[str | None],
        *,
        outputs: int | Sequence[str] = 1,
        name: str | None = None,
        **attributes: Any,
    ) -> Any:
        """Add one node of this op to the active build and return its output(s).

        Args:
            inputs: Value names for the formal inputs; trailing optional ones may be left out.
            outputs: How many outputs to produce (fresh names), or their names.
            name: The node name; a fresh one when omitted.
            **attributes: Attribute values; only those given are written (ONNX Runtime
                applies the declared defaults to the others).

        Raises:
            TypeError: for a wrong number of inputs or outputs, or an unknown or ill-typed
            attribute.
        """
        acc: Builder = current()
        count = outputs if isinstance(outputs, int) else len(outputs)
        self._check_arity(len(inputs), count, acc.where())
        values: dict[str, Any] = {
            k: self.attribute(k).coerce(self.op_type, v) for k, v in attributes.items()
        }
        names = [str(i) if i else "" for i in inputs]
        types = [spec.type_for(acc, names) for spec in self.outputs[:count]]
        return acc.op(
            self.op_type,
            names,
            domain=self.domain,
            outputs=outputs,
            name=name,
            output_types=types,
            **values,
        )

    def node(
        self, inputs: Sequence[str], outputs: Sequence[str], name: str, **attributes: Any
    ) -> onnx.NodeProto:
        """A NodeProto of this op, checked against the declaration (for graph surgery outside a
        build).

        Raises:
            TypeError: for a wrong number of inputs or outputs, or an unknown or ill-typed
            attribute.
        """
        self._check_arity(len(inputs), len(outputs), "")
        values: dict[str, Any] = {
            k: self.attribute(k).coerce(self.op_type, v) for k, v in attributes.items()
        }
        return onnx.helper.make_node(
            self.op_type, list(inputs), list(outputs), name=name, domain=self.domain, **values
        )

    def _check_arity(self, n_inputs: int, n_outputs: int, where: str) -> None:
        if not self.required_inputs <= n_inputs <= len(self.inputs):
            raise InvalidTypeError(
                f"{where}{self.op_type} takes {self.required_inputs} to {len(self.inputs)} inputs "
                f"({', '.join(self.inputs)}), got {n_inputs}."
            )
        if not 1 <= n_outputs <= len(self.outputs):
            raise InvalidTypeError(
                f"{where}{self.op_type} has 1 to {len(self.outputs)} outputs "
                f"({', '.join(o.name for o in self.outputs)}), {n_outputs} were asked for."
            )


_BOOL_FLAG = Output("updated_flag", elem_type=onnx.TensorProto.BOOL, shape=(1,))
#: SGDOptimizerV2's flag: ONNX Runtime 1.19.2's shape inference says scalar, its kernel returns
#: ``[1]``; declared
#: with either shape, every load or every step warned ("Error merging shape info for output
#: 'sgd.updated_flag_0'",
#: "Expected shape from model of {} does not match actual shape of {1}"). So its shape is left
#: unstated here, and
#: the SGD block reshapes it to ``[1]`` for the graph output (``onnxblocks.optim.sgd``).
_UNSHAPED_BOOL_FLAG = Output("updated_flag", elem_type=onnx.TensorProto.BOOL, shape=None)

#: ``AdamWOptimizer``: one AdamW step over sequences of parameters, gradients and moments.
#: ``adam_mode`` 0 follows torch.optim.AdamW (decay applied before the update; needs
#: ``correct_bias=1``), 1 follows Hugging Face's AdamW (decay applied after the update).
ADAMW_OPTIMIZER = ContribOp(
    "AdamWOptimizer",
    inputs=("lr", "step", "weights", "gradients", "momentums_1", "momentums_2", "update_signal"),
    required_inputs=6,
    outputs=(
        _BOOL_FLAG,
        Output("updated_weights", like_input=2),
        Output("updated_momentums_1", like_input=4),
        Output("updated_momentums_2", like_input=5),
    ),
    attributes=(
        Attribute("alpha", onnx.AttributeProto.FLOAT, 0.9),
        Attribute("beta", onnx.AttributeProto.FLOAT, 0.999),
        Attribute("epsilon", onnx.AttributeProto.FLOAT, 1e-8),
        Attribute("weight_decay", onnx.AttributeProto.FLOAT, 1e-2),
        Attribute("correct_bias", onnx.AttributeProto.INT, 1),
        Attribute("adam_mode", onnx.AttributeProto.INT, 0),
    ),
)

#: ``SGDOptimizerV2``: ``w -= lr * g`` over sequences of parameters and gradients.
SGD_OPTIMIZER_V2 = ContribOp(
    "SGDOptimizerV2",
    inputs=("lr", "weights", "gradients", "update_signal"),
    required_inputs=3,
    outputs=(_UNSHAPED_BOOL_FLAG, Output("updated_weights", like_input=1)),
)

#: ``InPlaceAccumulatorV2``: ``buffer = value if overwrite_flag else buffer + value``.
IN_PLACE_ACCUMULATOR_V2 = ContribOp(
    "InPlaceAccumulatorV2",
    inputs=("accumulation_buffer", "value", "overwrite_flag"),
    required_inputs=2,
    outputs=(_BOOL_FLAG, Output("accumulation_buffer_out", like_input=0)),
)

#: ``InplaceClipGradNorm``: scale a sequence of gradients so their global L2 norm is at most
#: ``max_norm``.
INPLACE_CLIP_GRAD_NORM = ContribOp(
    "InplaceClipGradNorm",
    inputs=("gradients",),
    required_inputs=1,
    outputs=(Output("clipped_gradients", like_input=0),),
    attributes=(
        Attribute("max_norm", onnx.AttributeProto.FLOAT, 1.0),
        Attribute("norm_type", onnx.AttributeProto.STRING, "fro"),
    ),
)

#: Every contrib op onnxblocks emits, by op type.
CONTRIB_OPS: dict[str, ContribOp] = {
    op.op_type: op
    for op in (ADAMW_OPTIMIZER, SGD_OPTIMIZER_V2, IN_PLACE_ACCUMULATOR_V2, INPLACE_CLIP_GRAD_NORM)
}
