"""One compiled graph: the ONNX Runtime sessions that run an ONNX graph's forward and backward for
torch.

:class:`Compiled` is built for one set of values that need a gradient. With
none it holds a single session on the forward graph. Otherwise it holds the two
halves of :func:`onnxblocks.gradient.split.split_vjp_graph`:

* ``run_forward`` runs the forward session. It returns the outputs as torch
  tensors (sharing ONNX Runtime's memory) and the ``OrtValueVector`` of
  everything it fetched, saved values included: the state the backward needs.
* ``run_backward`` feeds that state, the inputs and weights the backward reads
  and the incoming output gradients to the backward session.

Nothing of the forward runs again in the backward. The memory this costs is the
saved values, held from the forward until the backward frees them: the same
activations torch's own autograd keeps for the same graph (plus what ONNX
Runtime's gradient ops read that torch's would not, e.g. a MaxPool's indices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import torch

from onnxblocks._core import ort_errors
from onnxblocks._core.contracts import gradient_name
from onnxblocks._core.errors import GradientError
from onnxblocks._core.ort import capi
from onnxblocks.gradient import ort_bridge
from onnxblocks.gradient.dependencies import upstream_values
from onnxblocks.gradient.split import SplitVjp, set_input_types, split_vjp_graph, untyped_inputs
from onnxblocks.gradient.vjp import VjpGraph
from onnxblocks.ir import serde
from onnxblocks.torch import _interop

__all__ = ["DEFAULT_CONFIG", "Compiled", "Session", "SessionConfig"]


@dataclass(frozen=True)
class SessionConfig:
    """How the ONNX Runtime sessions are made.

    Attributes:
        custom_op_libraries: Shared libraries with custom ops, registered with each session.
        threads: ONNX Runtime's intra-op threads (0: its default, one per physical core).
    """

    custom_op_libraries: tuple[str, ...] = ()
    threads: int = 0


#: ONNX Runtime's default threads, no custom ops.
DEFAULT_CONFIG = SessionConfig()


class Session:
    """An ONNX Runtime CPU session (C bindings) run on ``OrtValueVector`` feeds and fetches."""

    def __init__(
        self, model: onnx.ModelProto, label: str, config: SessionConfig = DEFAULT_CONFIG
    ) -> None:
        C = capi()
        options = ort_bridge.session_options(
            config.custom_op_libraries
        )  # OSError naming a library that fails
        options.intra_op_num_threads = config.threads
        # torch runs between the sessions (the loss, the optimizer): ONNX Runtime's threads must not
        # spin-wait
        # for more work after a run, or they take the cores torch needs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = C.InferenceSession(options, model.SerializeToString(), False, False)
            self._session.initialize_session(["CPUExecutionProvider"], [{}], set())
        except Exception as exc:
            raise GradientError(
                f"ONNX Runtime could not load the {label} model: {ort_errors.clean_message(exc)}"
            ) from None
        self.label = label
        self.inputs = [vi.name for vi in model.graph.input]
        self.outputs = [vo.name for vo in model.graph.output]
        self._run_options = C.RunOptions()
        self._devices = [C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)] * len(
            self.outputs
        )

    def output_types(self) -> dict[str, int]:
        """The element type ONNX Runtime gives each graph output."""
        found = {}
        for meta in self._session.outputs_meta:
            kind = meta.type
            if kind.startswith("tensor(") and kind.endswith(")"):
                found[meta.name] = onnx.TensorProto.DataType.Value(
                    kind[len("tensor(") : -1].upper()
                )
        return found

    def run(self, feeds: Any) -> Any:
        """Run on an ``OrtValueVector`` in :attr:`inputs` order; return the ``OrtValueVector`` of
        :attr:`outputs`.
        """
        fetches = _interop.new_vector()
        try:
            self._session.run_with_ortvaluevector(
                self._run_options, self.inputs, feeds, self.outputs, fetches, self._devices
            )
        except Exception as exc:
            raise ort_errors.run_error(exc, f"the {self.label}") from None
        return fetches


@dataclass(frozen=True)
class _Source:
    """Where a backward input comes from: an argument, a forward fetch, an output gradient or a
    shared constant.
    """

    kind: str  # "arg", "fetch", "grad", "shared"
    index: int


class Compiled:
    """The sessions of one ONNX graph for one set of values that need a gradient.

    Args:
        vjp: The graph from :func:`~onnxblocks.gradient.vjp.build_vjp_graph`.
        arguments: The graph inputs in the order the caller passes tensors (user inputs, then
        weights).
        config: How the sessions are made.
    """

    def __init__(
        self, vjp: VjpGraph, arguments: Sequence[str], config: SessionConfig = DEFAULT_CONFIG
    ) -> None:
        self.vjp = vjp
        position = {name: i for i, name in enumerate(arguments)}
        self.outputs = vjp.outputs
        self.differentiable = tuple(o in set(vjp.differentiable) for o in vjp.outputs)
        #: For each gradient output, the argument it belongs to.
        self.gradient_of = tuple(position[name] for name in vjp.gradients)
        self.split: SplitVjp | None = None
        if not vjp.gradients:
            self.forward = Session(vjp.model, "forward graph", config)
            self._feed = [position[n] for n in self.forward.inputs]
            self._shared: list[Any] = []
            self.backward: Session | None = None
            self._backward_sources: list[_Source] = []
            self.gradient_sources: tuple[frozenset[int], ...] = ()
            self.backward_args: tuple[int, ...] = ()
            self.backward_outputs: tuple[int, ...] = ()
            return
        split = split_vjp_graph(vjp)
        self.split = split
        self.forward = Session(split.forward, "forward half of the VJP graph", config)
        n_args = len(self.forward.inputs) - len(split.shared)
        self._feed = [position[n] for n in self.forward.inputs[:n_args]]
        self._shared = [
            _interop.ortvalue_of(onnx.numpy_helper.to_array(t)) for t in split.shared_values
        ]
        backward_model = split.backward
        missing = untyped_inputs(backward_model)
        if missing:
            set_input_types(backward_model, self.forward.output_types())
        self.backward = Session(backward_model, "backward half of the VJP graph", config)
        fetched = {name: i for i, name in enumerate(self.forward.outputs)}
        grads = {name: i for i, name in enumerate(vjp.output_grads)}
        output_index = {name: i for i, name in enumerate(vjp.outputs)}
        shared = {name: i for i, name in enumerate(split.shared)}
        sources = []
        for name in self.backward.inputs:
            if name in shared:
                sources.append(_Source("shared", shared[name]))
            elif name in grads:
                sources.append(_Source("grad", output_index[vjp.differentiable[grads[name]]]))
            elif name in fetched:
                sources.append(_Source("fetch", fetched[name]))
            else:
                sources.append(_Source("arg", position[name]))
        self._backward_sources = sources
        #: For each gradient, the outputs whose incoming gradients it reads: when all of those are
        #: None (the loss
        #: does not use them), torch gives the argument no gradient (None), not zeros.
        self.gradient_sources = _gradient_sources(vjp, output_index)
        #: The arguments and outputs the backward reads (saved with ``ctx.save_for_backward``, so
        #: torch's version
        #: counters catch an in-place change between the forward and the backward).
        self.backward_args = tuple(sorted({s.index for s in sources if s.kind == "arg"}))
        self.backward_outputs = tuple(
            sorted({s.index for s in sources if s.kind == "fetch" and s.index < len(self.outputs)})
        )

    def run_forward(self, args: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
        """Run the forward session; return the outputs and the fetched ``OrtValueVector`` (the
        backward's state).
        """
        feeds = _interop.vector_of([args[i] for i in self._feed])
        for value in self._shared:
            feeds.push_back(value)
        fetches = self.forward.run(feeds)
        outputs = [_interop.to_torch(fetches, i) for i in range(len(self.outputs))]
        return outputs, fetches

    def run_backward(
        self, state: Any, args: dict[int, torch.Tensor], grad_outputs: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor]:
        """Run the backward session; return one gradient per value of ``vjp.gradients``.

        Args:
            state: The ``OrtValueVector`` :meth:`run_forward` returned.
            args: The arguments the backward reads (:attr:`backward_args`), by position.
            grad_outputs: The incoming gradient of each output (zeros are used for None).
        """
        assert self.backward is not None
        feeds = _interop.new_vector()
        feeds.reserve(len(self._backward_sources))
        for source in self._backward_sources:
            if source.kind == "fetch":
                feeds.push_back(state[source.index])
            elif source.kind == "arg":
                _interop.push(feeds, args[source.index])
            elif source.kind == "shared":
                feeds.push_back(self._shared[source.index])
            else:
                grad = grad_outputs[source.index]
                if grad is None:
                    elem = state.element_type_at(source.index)
                    grad = torch.zeros(
                        state[source.index].shape(), dtype=_interop.TORCH_OF_ONNX[elem]
                    )
                _interop.push(feeds, grad)
        fetches = self.backward.run(feeds)
        return [_interop.to_torch(fetches, i) for i in range(len(self.vjp.gradients))]


def _gradient_sources(vjp: VjpGraph, output_index: dict[str, int]) -> tuple[frozenset[int], ...]:
    """For each gradient of ``vjp``, the positions of the outputs whose incoming gradient it
    depends on.
    """
    graph = serde.from_proto(vjp.model).graph
    by_grad = {
        name: output_index[y] for name, y in zip(vjp.output_grads, vjp.differentiable, strict=True)
    }
    found = []
    for name in vjp.gradients:
        upstream = upstream_values(graph, [gradient_name(name)], differentiable=False)
        found.append(frozenset(by_grad[v.name] for v in upstream if v.name in by_grad))
    return tuple(found)
