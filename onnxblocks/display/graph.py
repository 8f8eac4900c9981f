"""A read-only index of an ONNX graph for display: nodes, values, roles and parts.

:class:`GraphIndex` reads a ``ModelProto`` once (O(nodes + values), no weight
bytes are touched) and answers the questions a picture or a summary needs:
which values are inputs, parameters (trainable or frozen), constants and
outputs; which node produces and which nodes consume a value; and which *part*
of a training graph each node belongs to:

* ``forward``: the model's own computation;
* ``loss``: forward nodes after the last use of a parameter that lead to the
  loss output (the loss subgraph);
* ``backward``: gradient nodes (they produce ``*_grad`` values or were named
  ``<node>_Grad/...`` by ONNX Runtime's gradient builder, or consume such values);
* ``accumulation``: gradient accumulation (``InPlaceAccumulatorV2``);
* ``optimizer``: optimizer ops (``AdamWOptimizer``, ``SGDOptimizerV2`` ...).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from onnxblocks._core.contracts import buffer_name, gradient_name, is_accumulation_value
from onnxblocks._core.contracts import is_gradient_value as _is_grad
from onnxblocks._core.contrib_ops import CONTRIB_OPS, IN_PLACE_ACCUMULATOR_V2
from onnxblocks._core.errors import UnknownNameError
from onnxblocks.display.entries import NodeInfo, TensorInfo, type_shape
from onnxblocks.display.entries import dtype_name as dtype_name

#: Node parts, in drawing-priority order.
PARTS = ("forward", "loss", "backward", "accumulation", "optimizer")

#: Accumulation ops: ours, and InPlaceAccumulator (version 1), which artifacts of ORT's own
#: builder may hold.
_ACCUMULATION_OPS = {IN_PLACE_ACCUMULATOR_V2.op_type, "InPlaceAccumulator"}
#: Optimizer ops: the ones onnxblocks emits, and ORT optimizers found in other artifacts.
_OPTIMIZER_OPS = {op for op in CONTRIB_OPS if op not in _ACCUMULATION_OPS} | {
    "AdamOptimizer",
    "SGDOptimizer",
    "LambOptimizer",
}
_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}


class GraphIndex:
    """Nodes, values, roles and parts of one ONNX graph (read once, never mutated).

    Args:
        model: The model (a ModelProto or a GraphProto). Weight bytes are not read.
        trainable: Names of trainable parameters, when the caller knows them.
        frozen: Names of frozen parameters, when the caller knows them.
        loss: Name of the loss output; by default the first output of a training
            graph, or the first scalar output of a graph without optimizer ops.
            ``""`` means the graph has no loss.
        loss_nodes: Names of the nodes that compute the loss (e.g. a loss block's
            ``nodes``); by default they are found from ``loss`` (see :meth:`parts`).

    When ``trainable`` is not given, it is guessed: in a training graph, the inputs
    that have a ``<name>_grad`` value are trainable; in any other graph,
    floating-point initializers not named in ``frozen`` are parameters of unknown
    status, and other initializers are constants. A frozen parameter of a
    training graph is a graph input like the data, so only ``frozen`` (or the
    checkpoint) tells them apart.
    """

    def __init__(
        self,
        model: onnx.ModelProto | onnx.GraphProto,
        trainable: Iterable[str] | None = None,
        frozen: Iterable[str] | None = None,
        loss: str | None = None,
        loss_nodes: Iterable[str] | None = None,
    ) -> None:
        graph = model.graph if isinstance(model, onnx.ModelProto) else model
        self.model = model if isinstance(model, onnx.ModelProto) else None
        self.graph_name = graph.name
        self.nodes: list[NodeInfo] = [
            NodeInfo(i, n.name or f"#{i}", n.op_type, n.domain, tuple(n.input), tuple(n.output))
            for i, n in enumerate(graph.node)
        ]
        self.by_name: dict[str, int] = {}
        for node in self.nodes:
            self.by_name.setdefault(node.name, node.index)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for node in self.nodes:
            for o in node.outputs:
                if o:
                    self.producer[o] = node.index
            for i in node.inputs:
                if i:
                    self.consumers.setdefault(i, []).append(node.index)

        types: dict[str, onnx.TypeProto] = {}
        for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
            if vi.type.WhichOneof("value"):
                types[vi.name] = vi.type
        self._types = types
        initializers = {init.name: init for init in graph.initializer}
        input_names = [i.name for i in graph.input]
        output_names = [o.name for o in graph.output]
        self.is_training = any(_is_grad(o) for o in output_names) or any(
            n.op_type in _ACCUMULATION_OPS for n in self.nodes
        )
        grads = {o for node in self.nodes for o in node.outputs} | set(output_names)
        inferred_trainable = {
            name
            for name in list(input_names) + list(initializers)
            if gradient_name(name) in grads or buffer_name(name) in input_names
        }
        trainable_set = set(trainable) if trainable is not None else inferred_trainable
        frozen_set = set(frozen or ()) - trainable_set

        def info(name: str, role: str, is_param: bool = False) -> TensorInfo:
            shape: tuple[int | str | None, ...] | None
            if name in initializers:
                init = initializers[name]
                dtype, shape = dtype_name(init.data_type), tuple(int(d) for d in init.dims)
            elif name in types:
                dtype, shape = type_shape(types[name])
            else:
                dtype, shape = "?", None
            status = None
            if is_param:
                status = True if name in trainable_set else False if name in frozen_set else None
            return TensorInfo(name, role, dtype, shape, status)

        params_named = trainable_set | frozen_set
        self.inputs: list[TensorInfo] = []
        self.params: list[TensorInfo] = []
        self.constants: list[TensorInfo] = []
        self.state: list[TensorInfo] = []
        seen: set[str] = set()
        for name in input_names:
            seen.add(name)
            if name in params_named:
                self.params.append(info(name, "param", True))
            elif is_accumulation_value(name):
                self.state.append(info(name, "state"))
            elif name not in initializers:
                self.inputs.append(info(name, "input"))
            else:
                seen.discard(name)  # an input with a default: treat it as an initializer
        for name, init in initializers.items():
            if name in seen:
                continue
            if name in params_named:
                self.params.append(info(name, "param", True))
            elif trainable is None and not self.is_training and init.data_type in _FLOAT_TYPES:
                self.params.append(info(name, "param", True))
            else:
                self.constants.append(info(name, "constant"))
        self.outputs: list[TensorInfo] = [info(name, "output") for name in output_names]
        self.tensors: dict[str, TensorInfo] = {
            t.name: t
            for t in self.inputs + self.params + self.constants + self.state + self.outputs
        }
        self.loss = (loss or None) if loss is not None else self._guess_loss(output_names)
        self.parts: list[str] = self._classify(None if loss_nodes is None else set(loss_nodes))

    # ---------------------------------------------------------------- queries
    def value_type(self, name: str) -> tuple[str, tuple[int | str | None, ...] | None]:
        """(dtype, shape) of any value, as far as the model records it."""
        if name in self.tensors:
            t = self.tensors[name]
            return t.dtype, t.shape
        if name in self._types:
            return type_shape(self._types[name])
        return "?", None

    def node(self, key: str | int) -> NodeInfo:
        """A node by index, name, or ``"#<index>"``.

        Raises:
            KeyError: if no node has that name.
        """
        if isinstance(key, int):
            return self.nodes[key]
        if key in self.by_name:
            return self.nodes[self.by_name[key]]
        if key.startswith("#") and key[1:].isdigit() and int(key[1:]) < len(self.nodes):
            return self.nodes[int(key[1:])]
        from onnxblocks._core.errors import did_you_mean

        raise UnknownNameError(
            f"The graph has no node named '{key}'.{did_you_mean(key, self.by_name)} "
            "Pass a node name (or '#<index>' for an unnamed node)."
        )

    def part_counts(self) -> dict[str, int]:
        """How many nodes each part has (parts without nodes are left out)."""
        counts: dict[str, int] = {}
        for p in self.parts:
            counts[p] = counts.get(p, 0) + 1
        return {p: counts[p] for p in PARTS if p in counts}

    def op_counts(self, indices: Iterable[int] | None = None) -> dict[str, int]:
        """Op type histogram, most frequent first."""
        counts: dict[str, int] = {}
        for i in range(len(self.nodes)) if indices is None else indices:
            op = self.nodes[i].op_type
            counts[op] = counts.get(op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def predecessors(self, i: int) -> set[int]:
        """Indices of the nodes producing node ``i``'s inputs."""
        return {self.producer[v] for v in self.nodes[i].inputs if v in self.producer}

    def successors(self, i: int) -> set[int]:
        """Indices of the nodes consuming node ``i``'s outputs."""
        out: set[int] = set()
        for v in self.nodes[i].outputs:
            out.update(self.consumers.get(v, ()))
        return out

    # ---------------------------------------------------------------- parts
    def _guess_loss(self, output_names: list[str]) -> str | None:
        if not output_names or any(n.op_type in _OPTIMIZER_OPS for n in self.nodes):
            return None
        if self.is_training:
            return output_names[0]
        for name in output_names:
            _, shape = self.value_type(name)
            if shape in ((), (1,)):
                return name
        return None

    def _classify(self, loss_nodes: set[str] | None) -> list[str]:
        parts = ["forward"] * len(self.nodes)
        backward_values: set[str] = set()
        for node in self.nodes:
            if node.op_type in _OPTIMIZER_OPS:
                parts[node.index] = "optimizer"
            elif node.op_type in _ACCUMULATION_OPS or any(
                is_accumulation_value(o) for o in node.outputs
            ):
                parts[node.index] = "accumulation"
            elif (
                "_Grad/" in node.name
                or any(_is_grad(o) for o in node.outputs if o)
                or any(i in backward_values or _is_grad(i) for i in node.inputs if i)
            ):
                parts[node.index] = "backward"
                backward_values.update(o for o in node.outputs if o)
        if loss_nodes is not None:
            for node in self.nodes:
                if node.name in loss_nodes and parts[node.index] == "forward":
                    parts[node.index] = "loss"
        elif self.loss is not None and self.loss in self.producer:
            self._mark_loss(parts)
        return parts

    def _mark_loss(self, parts: list[str]) -> None:
        """Mark forward ancestors of the loss that no parameter flows into after them."""
        param_names = {p.name for p in self.params}
        # Forward nodes from which a parameter-consuming forward node is reachable.
        uses_param_later = [False] * len(self.nodes)
        for node in reversed(self.nodes):
            if parts[node.index] != "forward":
                continue
            if any(i in param_names for i in node.inputs):
                uses_param_later[node.index] = True
                continue
            for s in self.successors(node.index):
                if parts[s] == "forward" and uses_param_later[s]:
                    uses_param_later[node.index] = True
                    break
        # Walk back from the loss over forward nodes.
        assert self.loss is not None
        stack = [self.producer[self.loss]]
        seen: set[int] = set()
        while stack:
            i = stack.pop()
            if i in seen or parts[i] != "forward":
                continue
            seen.add(i)
            if not uses_param_later[i]:
                parts[i] = "loss"
                stack.extend(self.predecessors(i))
