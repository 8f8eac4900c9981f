"""Which values of a model are trainable, frozen, or inputs that need a gradient.

A *parameter* is a top-level initializer of the graph. ``requires_grad`` names
parameters (they become trainable) or graph inputs (their gradient becomes an
output of the training model). ``frozen`` names parameters that are fed to the
model from the checkpoint but get no gradient. Every other initializer stays a
constant of the graph.

The order of parameters is the order of the graph's initializers: it is the
order of the parameter inputs of both the training and the eval model, which
ONNX Runtime's training API requires to match.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx
import onnx_ir as ir

from onnxblocks._core.errors import (
    GradientError,
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks.ir.types import elem_type

#: Element types a trainable parameter (or an input that requires a gradient) may have.
FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE,
    }
)


@dataclass(frozen=True)
class ParameterPartition:
    """The parameters of a model, split by role, each in graph-initializer order.

    Attributes:
        trainable: Parameters that get a gradient.
        frozen: Parameters fed from the checkpoint without a gradient.
        parameters: Trainable and frozen parameters interleaved in graph-initializer
            order: the order of the parameter inputs of the training and eval models.
        input_grads: Graph inputs whose gradient the training model outputs.
    """

    trainable: tuple[str, ...]
    frozen: tuple[str, ...]
    parameters: tuple[str, ...]
    input_grads: tuple[str, ...] = ()

    @property
    def requires_grad(self) -> tuple[str, ...]:
        """Every value whose gradient is built: trainable parameters, then inputs."""
        return self.trainable + self.input_grads


def _suggest(name: str, candidates: list[str]) -> str:
    """A "did you mean" hint, trying a case-insensitive match first."""
    folded = [c for c in candidates if c.lower() == name.lower()]
    if folded:
        return " Did you mean " + " or ".join(repr(c) for c in folded) + "?"
    return did_you_mean(name, candidates)


def _elem_name(elem_type: int) -> str:
    return onnx.TensorProto.DataType.Name(elem_type).lower()


def _element_types(graph: onnx.GraphProto | ir.Graph) -> tuple[dict[str, int], dict[str, int]]:
    """The element types of ``graph``'s initializers and of its other inputs, by name, in order
    (0 for an input that is not a tensor).
    """
    if isinstance(graph, onnx.GraphProto):
        initializers = {init.name: init.data_type for init in graph.initializer}
        inputs = {
            vi.name: (
                vi.type.tensor_type.elem_type if vi.type.WhichOneof("value") == "tensor_type" else 0
            )
            for vi in graph.input
            if vi.name not in initializers
        }
        return initializers, inputs
    initializers = {name: elem_type(v) or 0 for name, v in graph.initializers.items()}
    inputs = {v.name or "": elem_type(v) or 0 for v in graph.inputs if v.name not in initializers}
    return initializers, inputs


def partition_parameters(
    graph: onnx.GraphProto | ir.Graph, requires_grad: Iterable[str], frozen: Iterable[str]
) -> ParameterPartition:
    """Check the names of ``requires_grad`` and ``frozen`` against ``graph`` and split them by role.

    Args:
        graph: The graph whose initializers are the parameters.
        requires_grad: Parameters to train, and graph inputs whose gradient is wanted.
        frozen: Parameters to feed from the checkpoint without a gradient. A graph
            input named here is ignored (inputs get no gradient unless asked).

    Returns:
        The partition, each list in the order of the graph's initializers (inputs:
        in the order of the graph inputs).

    Raises:
        ValueError: if a name is both trainable and frozen.
        UnknownNameError: if a name is neither an initializer nor a graph input.
        TypeError: if a value that requires a gradient is not a floating-point tensor.
    """
    requires_grad = list(dict.fromkeys(requires_grad))
    frozen = list(dict.fromkeys(frozen))
    both = [n for n in requires_grad if n in set(frozen)]
    if both:
        raise InvalidValueError(
            f"{preview(both)} cannot be both trainable (requires_grad) and frozen (frozen_params). "
            "Remove each from one of the two lists."
        )
    initializers, inputs = _element_types(graph)
    for role, names in (("requires_grad", requires_grad), ("frozen_params", frozen)):
        for name in names:
            if not isinstance(name, str):
                raise InvalidTypeError(
                    f"{role} must list value names (str), not {type(name).__name__}: {name!r}."
                )
            if name in initializers or name in inputs:
                continue
            raise UnknownNameError(
                f"{role} names '{name}', which is not a parameter (initializer) or graph input "
                "of the model."
                f"{_suggest(name, list(initializers) + list(inputs))} "
                f"Parameters: {preview(initializers)}. Graph inputs: {preview(inputs)}. If the "
                "model comes "
                "from torch.onnx.export, export it with its optimisations off (dynamo=True with "
                "optimize=False, "
                "or do_constant_folding=False): they fold, merge and rename parameters. A "
                "parameter shared by "
                "several modules (tied weights) is exported once, under one of its names."
            )
    for name in requires_grad:
        kind = "parameter" if name in initializers else "graph input"
        elem = initializers[name] if name in initializers else inputs[name]
        if elem not in FLOAT_TYPES:
            raise InvalidTypeError(
                f"{kind} '{name}' has element type {_elem_name(elem)}, but only floating-point "
                "tensors "
                "(float, float16, bfloat16, double) can require a gradient. Freeze it instead "
                "(frozen_params / requires_grad(name, False)) or leave it out."
            )
    wanted = set(requires_grad)
    still = set(frozen)
    trainable = tuple(n for n in initializers if n in wanted)
    frozen_params = tuple(n for n in initializers if n in still)
    ordered = tuple(n for n in initializers if n in wanted or n in still)
    input_grads = tuple(n for n in inputs if n in wanted)
    return ParameterPartition(trainable, frozen_params, ordered, input_grads)


def check_requires_grad_read(graph: ir.Graph, partition: ParameterPartition) -> None:
    """Raise when a value that requires a gradient is read by no node at all (subgraphs included).

    Raises:
        GradientError: naming the values, suggesting to freeze them.
    """
    values = {v.name: v for v in [*graph.inputs, *graph.initializers.values()]}
    unread = [n for n in partition.requires_grad if n not in values or not values[n].uses()]
    if unread:
        raise GradientError(
            f"{preview(unread)} require a gradient but no node of the model reads them, so the "
            "loss cannot "
            "depend on them. Freeze them (frozen_params / requires_grad(name, False)) or leave "
            "them out."
        )
