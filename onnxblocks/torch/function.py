"""ONNX graphs as ``torch.autograd.Function`` classes and ``nn.Module`` s (the role of
``TorchOrtFactory``).

:func:`onnx_function` turns an ONNX model into a ``torch.autograd.Function``
subclass whose forward and backward run in ONNX Runtime; :class:`OnnxModule`
holds the trainable initializers as ``nn.Parameter`` s and calls it, so any
``torch.optim`` optimizer trains them.

**How the backward is built.** :func:`onnxblocks.gradient.build_vjp_graph` runs
ONNX Runtime's gradient builder with the differentiable outputs as its *y* nodes
and no loss, so the incoming output gradients are graph inputs and the graph
computes the vector-Jacobian product directly (a scalar ``sum_i <y_i, g_i>`` loss
would add a multiply, a reduction and their gradients per output). One graph is
built per set of arguments that require a gradient.

**No recomputation.** :func:`onnxblocks.gradient.split_vjp_graph` cuts that
graph into a forward and a backward model. The forward session returns the
outputs and the values the backward reads (activations, Dropout masks,
normalisation statistics); they stay in ONNX Runtime's memory, referenced by the
autograd context, until the backward has run, then they are freed. That is the
memory torch's autograd would keep for the same graph. onnxruntime-training
1.19.2 also offers ``TrainingAgent`` with ``PartialGraphExecutionState`` (what
``ORTModule`` used: one session paused at a ``YieldOp`` between forward and
backward); it needs a graph built by ``OrtModuleGraphBuilder`` with ORTModule's
own conventions, while two plain sessions run the graph onnxblocks built and
normalised, with the same saved values.

**Limits.** Tensors must be on the CPU. The backward runs once per forward:
``retain_graph=True`` with a second backward, and double backward
(``create_graph=True``), raise a ``RuntimeError`` that says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import onnx
import torch

from onnxblocks._core.errors import (
    InvalidTypeError,
    StateError,
    UnknownNameError,
    did_you_mean,
    preview,
)
from onnxblocks.torch._program import Program, load_model
from onnxblocks.torch._sessions import SessionConfig

__all__ = ["OnnxFunction", "OnnxModule", "onnx_function"]


class OnnxFunction(torch.autograd.Function):
    """Base of the classes :func:`onnx_function` returns: ``apply(*inputs, *weights)``.

    Attributes:
        program: The graph, its argument names and its compiled sessions.
        input_names: The user inputs, in the order ``apply`` takes them.
        weight_names: The weights (initializers) ``apply`` takes after the inputs.
        output_names: The outputs ``apply`` returns (one tensor, or a tuple).
    """

    program: ClassVar[Program]
    input_names: ClassVar[tuple[str, ...]] = ()
    weight_names: ClassVar[tuple[str, ...]] = ()
    output_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run the graph: ``apply(*inputs, *weights)``; returns a tensor, or a tuple for several
        outputs.

        Raises:
            TypeError: for a wrong number of tensors, a non-tensor or a dtype the graph does not
            declare.
            ValueError: for a shape the graph does not declare, or a tensor off the CPU.
        """
        if kwargs:
            raise InvalidTypeError(
                f"{cls.__name__}.apply takes tensors by position: inputs, then weights."
            )
        return cls.apply_checked(cls.program.check(args))

    @classmethod
    def apply_checked(cls, tensors: Sequence[torch.Tensor]) -> Any:
        """:meth:`apply` for tensors already checked against the graph (as :class:`OrtModule`
        does).
        """
        program = cls.program
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return super().apply(program, *tensors)
        outputs, _ = program.compiled(frozenset()).run_forward(tensors)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def forward(ctx: Any, program: Program, *args: torch.Tensor) -> Any:
        requires = frozenset(
            n for n, need in zip(program.arguments, ctx.needs_input_grad[1:], strict=True) if need
        )
        compiled = program.compiled(requires)
        outputs, state = compiled.run_forward(args)
        ctx.set_materialize_grads(False)
        ctx.compiled = compiled
        ctx.state = state if compiled.backward is not None else None
        ctx.argument_count = len(args)
        ctx.gradient_shapes = [args[i].shape for i in compiled.gradient_of]
        ctx.gradient_dtypes = [args[i].dtype for i in compiled.gradient_of]
        ctx.save_for_backward(
            *(args[i] for i in compiled.backward_args),
            *(outputs[i] for i in compiled.backward_outputs),
        )
        still = [
            o
            for o, differentiable in zip(outputs, compiled.differentiable, strict=True)
            if not differentiable
        ]
        if still:
            ctx.mark_non_differentiable(*still)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor | None) -> Any:
        compiled = ctx.compiled
        nothing: list[torch.Tensor | None] = [None] * (1 + ctx.argument_count)
        if compiled.backward is None:
            return tuple(nothing)
        if torch.is_grad_enabled():
            raise StateError(
                "Double backward (create_graph=True) through an ONNX graph is not supported: its "
                "backward runs "
                "in ONNX Runtime and is not itself differentiable. Call backward() without "
                "create_graph."
            )
        if ctx.state is None:
            raise StateError(
                "The values an ONNX graph saved for its backward were freed by the first backward "
                "(retain_graph=True does not keep them). Run the forward again before a second "
                "backward."
            )
        if any(g is not None for g in grad_outputs) and all(
            g is None or g.numel() == 0 for g in grad_outputs
        ):
            # empty output gradients (an empty batch): the vector-Jacobian product is zero, as
            # torch's
            ctx.state = None
            for position, shape, dtype in zip(
                compiled.gradient_of, ctx.gradient_shapes, ctx.gradient_dtypes, strict=True
            ):
                nothing[1 + position] = torch.zeros(shape, dtype=dtype)
            return tuple(nothing)
        saved_args = ctx.saved_tensors[
            : len(compiled.backward_args)
        ]  # reading them checks their versions
        reached = [
            any(grad_outputs[i] is not None for i in sources)
            for sources in compiled.gradient_sources
        ]
        if not any(
            reached
        ):  # the loss uses no output the gradients depend on: None for all, as torch gives
            ctx.state = None
            return tuple(nothing)
        saved = dict(zip(compiled.backward_args, saved_args, strict=True))
        gradients = compiled.run_backward(ctx.state, saved, grad_outputs)
        ctx.state = None
        for position, shape, grad, used in zip(
            compiled.gradient_of, ctx.gradient_shapes, gradients, reached, strict=True
        ):
            if used:
                nothing[1 + position] = grad if grad.shape == shape else grad.reshape(shape)
        return tuple(nothing)


def onnx_function(
    model: onnx.ModelProto | str | os.PathLike[str],
    trainable: Sequence[str],
    *,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    no_grad_outputs: Iterable[str] = (),
    custom_op_libraries: Sequence[str] = (),
    threads: int = 0,
    check: bool = True,
) -> type[OnnxFunction]:
    """An autograd Function class that runs ``model`` forward and backward in ONNX Runtime.

    ``apply(*inputs, *weights)`` takes the user inputs, then one tensor per name of
    ``trainable`` in that order; it returns the outputs (a tuple when there are
    several). Gradients flow to the weights and inputs that require one; an output
    that gets no gradient (unused, or None) is fine. Initializers not listed in
    ``trainable`` stay constants of the graph.

    Args:
        model: The ONNX model or its path (never mutated).
        trainable: Initializers the caller feeds (and may train), in the caller's order.
        inputs: The order ``apply`` takes the graph inputs in; defaults to the graph's order.
        outputs: The outputs to return, in order; defaults to the graph outputs.
        no_grad_outputs: Outputs that never take a gradient.
        custom_op_libraries: Shared libraries with custom ops.
        threads: ONNX Runtime's intra-op threads (0: its default, one per physical core).
        check: Build the backward graph now for the weights, so a graph ONNX Runtime
            cannot differentiate fails here (naming the node and op), not at the first call.

    Returns:
        A new subclass of :class:`OnnxFunction`.

    Raises:
        UnknownNameError: for an input, output or initializer name the model does not have.
        GradientError: when ``check`` and ONNX Runtime cannot differentiate the graph.
    """
    config = SessionConfig(tuple(custom_op_libraries), threads)
    program = Program(load_model(model), trainable, inputs, outputs, no_grad_outputs, config)
    if check:
        program.compiled(frozenset(program.weights))
    return type(
        "OnnxGraphFunction",
        (OnnxFunction,),
        {
            "program": program,
            "input_names": program.inputs,
            "weight_names": program.weights,
            "output_names": program.outputs,
            "__doc__": "ONNX graph run by ONNX Runtime: "
            f"apply({', '.join((*program.inputs, *program.weights))}).",
        },
    )


class OnnxModule(torch.nn.Module):
    """An ONNX graph as a torch module: its trainable initializers are ``nn.Parameter`` s.

    Parameters keep the initializers' names: ``fc1.weight`` is the parameter
    ``weight`` of the child ``fc1`` (as in the torch module it was exported from),
    so ``named_parameters()`` and ``state_dict()`` list the initializer names.

    Args:
        model: The ONNX model or its path (never mutated).
        trainable: Initializers to hold as parameters (copied from the model), in this order.
        inputs: The order ``forward`` takes the graph inputs in; defaults to the graph's order.
        outputs: The outputs ``forward`` returns; defaults to the graph outputs.
        no_grad_outputs: Outputs that never take a gradient.
        custom_op_libraries: Shared libraries with custom ops.
        threads: ONNX Runtime's intra-op threads (0: its default, one per physical core).

    Raises:
        UnknownNameError: for a name the model does not have.
        GradientError: when ONNX Runtime cannot differentiate the graph.
    """

    def __init__(
        self,
        model: onnx.ModelProto | str | os.PathLike[str],
        trainable: Sequence[str],
        *,
        inputs: Sequence[str] | None = None,
        outputs: Sequence[str] | None = None,
        no_grad_outputs: Iterable[str] = (),
        custom_op_libraries: Sequence[str] = (),
        threads: int = 0,
    ) -> None:
        super().__init__()
        loaded = load_model(model)
        self.function = onnx_function(
            loaded,
            trainable,
            inputs=inputs,
            outputs=outputs,
            no_grad_outputs=no_grad_outputs,
            custom_op_libraries=custom_op_libraries,
            threads=threads,
        )
        initializers = {init.name: init for init in loaded.graph.initializer}
        self._weights: list[tuple[torch.nn.Module, str]] = []
        for name in self.function.weight_names:
            value = torch.from_numpy(onnx.numpy_helper.to_array(initializers[name]).copy())
            owner, leaf = self._owner(name)
            owner.register_parameter(
                leaf, torch.nn.Parameter(value, requires_grad=value.is_floating_point())
            )
            self._weights.append((owner, leaf))

    def _owner(self, name: str) -> tuple[torch.nn.Module, str]:
        """The child module (created on the way) and attribute name that hold parameter ``name``."""
        *path, leaf = name.split(".")
        owner: torch.nn.Module = self
        for part in path:
            child = owner._modules.get(part)
            if child is None:
                if not part or hasattr(owner, part):
                    return self, name.replace(".", "_")
                child = torch.nn.Module()
                owner.add_module(part, child)
            owner = child
        if (
            not leaf
            or leaf in owner._modules
            or (hasattr(owner, leaf) and leaf not in owner._parameters)
        ):
            return self, name.replace(".", "_")
        return owner, leaf

    @property
    def input_names(self) -> tuple[str, ...]:
        """The graph inputs ``forward`` takes, in order."""
        return self.function.input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        """The outputs ``forward`` returns, in order."""
        return self.function.output_names

    def forward(self, *inputs: torch.Tensor, **named: torch.Tensor) -> Any:
        """Run the graph on ``inputs`` (by position, or by graph input name); returns a tensor or a
        tuple.

        Raises:
            TypeError: for inputs given twice or missing.
            UnknownNameError: for a keyword that is not a graph input.
        """
        names = self.function.input_names
        if named:
            for key in named:
                if key not in names:
                    raise UnknownNameError(
                        f"'{key}' is not a graph input.{did_you_mean(key, names)} Graph inputs: "
                        f"{preview(names)}."
                    )
            given = dict(zip(names, inputs, strict=False))
            twice = [k for k in named if k in given]
            if twice:
                raise InvalidTypeError(
                    f"Inputs {preview(twice)} were given both by position and by name."
                )
            given.update(named)
            missing = [n for n in names if n not in given]
            if missing:
                raise InvalidTypeError(f"Missing graph inputs {preview(missing)}.")
            inputs = tuple(given[n] for n in names)
        weights = [getattr(owner, leaf) for owner, leaf in self._weights]
        return self.function.apply(*inputs, *weights)
