"""An ONNX graph as torch calls it: named arguments checked, one compiled graph per set needing a
gradient.

A :class:`Program` takes tensors in a fixed order (the user inputs, then the
weights) and compiles the graph (:class:`~onnxblocks.torch._sessions.Compiled`)
once for each set of arguments that require a gradient: the set decides which
gradients the backward graph computes, so an input that does not require a
gradient costs nothing in the backward.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import onnx
import torch

from onnxblocks._core.errors import (
    FileMissingError,
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks.gradient import build_vjp_graph
from onnxblocks.gradient.signature import select_outputs
from onnxblocks.torch import _interop
from onnxblocks.torch._sessions import DEFAULT_CONFIG, Compiled, SessionConfig

__all__ = ["Program", "load_model"]


def load_model(model: onnx.ModelProto | str | os.PathLike[str]) -> onnx.ModelProto:
    """A copy of ``model``, or the model at a path (with its external data).

    Raises:
        TypeError: for anything else.
        FileNotFoundError: for a path that does not exist.
    """
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, (str, os.PathLike)):
        if not os.path.exists(model):
            raise FileMissingError(f"No ONNX model at '{os.fspath(model)}'.")
        return onnx.load(os.fspath(model))
    raise InvalidTypeError(
        f"model must be an onnx.ModelProto or a path, not {type(model).__name__}."
    )


class Program:
    """An ONNX graph called with tensors: user inputs in order, then weights (initializers) in
    order.

    Args:
        model: The forward model (copied).
        weights: Initializers fed by the caller instead of read from the graph, in the caller's
        order.
        inputs: The order of the user inputs; defaults to the graph's order.
        outputs: The outputs to return, in order; defaults to the graph outputs.
        no_grad_outputs: Outputs that never take a gradient.
        config: How the ONNX Runtime sessions are made (custom op libraries, threads).

    Raises:
        UnknownNameError: for a name the model does not have.
        ValueError: for a name listed twice, or inputs that leave out a graph input.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        weights: Sequence[str],
        inputs: Sequence[str] | None = None,
        outputs: Sequence[str] | None = None,
        no_grad_outputs: Iterable[str] = (),
        config: SessionConfig = DEFAULT_CONFIG,
    ) -> None:
        self.model = model
        graph = model.graph
        initializers = {init.name: init for init in graph.initializer}
        graph_inputs = {vi.name: vi for vi in graph.input if vi.name not in initializers}
        self.weights = _unique(weights, "weights")
        for name in self.weights:
            if name not in initializers:
                raise UnknownNameError(
                    f"'{name}' is not an initializer of the model.{_suggest(name, initializers)} "
                    f"Initializers: {preview(initializers)}."
                )
        if inputs is None:
            self.inputs = tuple(graph_inputs)
        else:
            self.inputs = _unique(inputs, "inputs")
            for name in self.inputs:
                if name not in graph_inputs:
                    raise UnknownNameError(
                        f"'{name}' is not a graph input of the "
                        f"model.{_suggest(name, graph_inputs)} "
                        f"Graph inputs: {preview(graph_inputs)}."
                    )
            left_out = [n for n in graph_inputs if n not in set(self.inputs)]
            if left_out:
                raise InvalidValueError(
                    f"inputs leaves out graph inputs {preview(left_out)}; list every graph "
                    "input, in the order "
                    "the tensors will be passed."
                )
        self.outputs = select_outputs(graph, outputs)
        self.no_grad_outputs = tuple(no_grad_outputs)
        self.config = config
        self.arguments = (*self.inputs, *self.weights)
        self.signature = [_declared(graph_inputs[n].type) for n in self.inputs] + [
            (initializers[n].data_type, [int(d) for d in initializers[n].dims])
            for n in self.weights
        ]
        self._compiled: dict[frozenset[str], Compiled] = {}
        #: The graph compiled most recently for a non-empty set of arguments needing a gradient.
        self.latest: Compiled | None = None

    def compiled(self, requires_grad: frozenset[str]) -> Compiled:
        """The graph compiled for the arguments in ``requires_grad`` (built on first use, then
        cached).
        """
        found = self._compiled.get(requires_grad)
        if found is None:
            vjp = build_vjp_graph(
                self.model,
                requires_grad=[n for n in self.arguments if n in requires_grad],
                frozen_params=[n for n in self.weights if n not in requires_grad],
                outputs=self.outputs,
                no_grad_outputs=self.no_grad_outputs,
                custom_op_libraries=self.config.custom_op_libraries,
            )
            found = Compiled(vjp, self.arguments, self.config)
            self._compiled[requires_grad] = found
        if requires_grad:
            self.latest = found
        return found

    def check(self, args: Sequence[object]) -> list[torch.Tensor]:
        """Check the number, kind, device, dtype and shape of the arguments against the graph.

        Raises:
            TypeError: for a wrong count, a non-tensor or a wrong dtype.
            ValueError: for a tensor on another device, or of the wrong rank or size.
        """
        if len(args) != len(self.arguments):
            raise InvalidTypeError(
                f"Expected {len(self.inputs)} input(s) {preview(self.inputs)} then "
                f"{len(self.weights)} weight(s) "
                f"{preview(self.weights)}, got {len(args)} tensors."
            )
        tensors = []
        for name, value, (elem, dims) in zip(self.arguments, args, self.signature, strict=True):
            if not isinstance(value, torch.Tensor):
                raise InvalidTypeError(
                    f"'{name}' must be a torch.Tensor, not {type(value).__name__}."
                )
            if value.device.type != "cpu":
                raise InvalidValueError(
                    f"'{name}' is on {value.device}; onnxruntime-training-cpu runs on the CPU: "
                    "pass CPU tensors."
                )
            given = _interop.ONNX_OF_TORCH.get(value.dtype)
            if elem and given != elem:
                raise InvalidTypeError(
                    f"'{name}' is {value.dtype}, but the graph declares it "
                    f"{_interop.onnx_type_name(elem)} "
                    f"({_interop.TORCH_OF_ONNX.get(elem, 'no torch dtype')}). "
                    "Convert it with .to(dtype)."
                )
            if dims is not None and (
                value.dim() != len(dims)
                or any(d is not None and d != s for d, s in zip(dims, value.shape, strict=True))
            ):
                declared = ["?" if d is None else d for d in dims]
                raise InvalidValueError(
                    f"'{name}' has shape {list(value.shape)}, but the graph declares {declared}."
                )
            tensors.append(value)
        return tensors


def _suggest(name: str, candidates: Iterable[str]) -> str:
    """A "did you mean" hint, trying a case-insensitive match first."""
    names = list(candidates)
    folded = [c for c in names if c.lower() == name.lower()]
    if folded:
        return " Did you mean " + " or ".join(repr(c) for c in folded) + "?"
    return did_you_mean(name, names)


def _unique(names: Iterable[str], role: str) -> tuple[str, ...]:
    listed = list(names)
    for name in listed:
        if not isinstance(name, str):
            raise InvalidTypeError(
                f"{role} must list names (str), not {type(name).__name__}: {name!r}."
            )
    twice = sorted({n for n in listed if listed.count(n) > 1})
    if twice:
        raise InvalidValueError(f"{role} lists {preview(twice)} more than once.")
    return tuple(listed)


def _declared(t: onnx.TypeProto) -> tuple[int, list[int | None] | None]:
    """The element type and dims (None where symbolic) a graph input declares."""
    if t.WhichOneof("value") != "tensor_type":
        return 0, None
    tensor = t.tensor_type
    if not tensor.HasField("shape"):
        return tensor.elem_type, None
    return tensor.elem_type, [
        d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in tensor.shape.dim
    ]
