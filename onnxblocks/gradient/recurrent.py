"""Recurrent ops (RNN, GRU, LSTM) in forms ONNX Runtime 1.19.2 can train on CPU.

ONNX Runtime trains ``GRU`` and ``LSTM`` with its own kernels (``GRUTraining``,
``LSTMTraining``), which run the forward direction only, in float32 only; ``RNN``
has no gradient builder at all. The torch exporters emit
``direction="bidirectional"`` for ``bidirectional=True``, double-precision nodes
for ``.double()`` models and ``RNN`` for ``nn.RNN`` (torchscript exporter).

* ``recurrent_directions_as_forward`` splits a ``reverse`` or
  ``bidirectional`` node into forward nodes: the reverse direction runs on the
  time-reversed input (``Gather`` with indices ``T-1 ... 0``) and its output is
  reversed back; the directions' outputs are concatenated as the original node
  stacks them. Each direction's weights are ``Slice`` s of the original ones, so
  gradients reach the same parameters.
* ``recurrent_as_elementary`` unrolls forward ``RNN`` nodes, and ``GRU`` /
  ``LSTM`` nodes that are not float32, over a static sequence length into
  ``MatMul``, ``Sigmoid``, ``Tanh``... following the ONNX equations.

Nodes with ``sequence_lens``, ``layout=1``, ``clip`` or non-default activations are
left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import onnx
import onnx_ir as ir

from onnxblocks.ir import attributes
from onnxblocks.ir.rewrite import NodeRewrite, NoMatch, RewriteContext, fail, is_default_domain
from onnxblocks.ir.writer import Writer

#: op type -> (gates, activations per direction)
_KINDS = {"RNN": (1, 1), "GRU": (3, 2), "LSTM": (4, 3)}
_DEFAULT_ACTIVATIONS = {
    "RNN": ["tanh"],
    "GRU": ["sigmoid", "tanh"],
    "LSTM": ["sigmoid", "tanh", "tanh"],
}
_RNN_ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu", "sigmoid": "Sigmoid"}


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _output(node: ir.Node, index: int) -> str | None:
    return (
        node.outputs[index].name if len(node.outputs) > index and node.outputs[index].name else None
    )


def _direction(node: ir.Node) -> str:
    return attributes.string_attribute(node, "direction", "forward")


def _activations(node: ir.Node) -> list[str] | None:
    return attributes.strings_attribute(node, "activations", None)


def _supported(node: ir.Node) -> bool:
    """Common preconditions of both rewrites."""
    return (
        is_default_domain(node)
        and node.op_type in _KINDS
        and _input(node, 4) is None  # sequence_lens
        and attributes.int_attribute(node, "layout", 0) == 0
        and attributes.value(node, "clip") is None
        and not attributes.int_attribute(node, "input_forget", 0)
    )


def _hint(node: ir.Node) -> str:
    return node.outputs[0].name or node.name or node.op_type


# ------------------------------------------------------------------ directions
class RecurrentDirectionsAsForward(NodeRewrite):
    """Split ``reverse`` and ``bidirectional`` RNN/GRU/LSTM nodes into forward-direction nodes."""

    name = "recurrent_directions_as_forward"
    op_types = frozenset(_KINDS)

    def select(self, node: ir.Node) -> bool:
        return _supported(node) and _direction(node) != "forward"

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        w = ctx.writer(_hint(node))
        shape = ctx.types.shape(node.inputs[0])
        _split_directions(w, node, shape[0] if shape else None)
        return w.nodes


def _split_directions(w: Writer, node: ir.Node, steps: int | None) -> None:
    direction = _direction(node)
    kinds = ["forward", "reverse"] if direction == "bidirectional" else ["reverse"]
    per_direction = _KINDS[node.op_type][1]
    activations = _activations(node)
    alpha = attributes.floats_attribute(node, "activation_alpha", None)
    beta = attributes.floats_attribute(node, "activation_beta", None)
    x = node.inputs[0]
    assert x is not None  # an RNN's X is required
    reversed_time = None
    outputs: list[list[ir.Value | None]] = []  # per direction: Y, Y_h, (Y_c); None where absent
    for d, kind in enumerate(kinds):
        inputs: list[ir.Value | None] = list(node.inputs)
        # weights, biases, initial states and peepholes: this direction's slice along axis 0
        for i in (1, 2, 3, 5, 6, 7):
            read = _input(node, i)
            if read is not None and len(kinds) > 1:
                inputs[i] = w.slice(read, [d], [d + 1], [0])
        flip = None  # the time-reversal indices when this direction runs reversed
        if kind == "reverse":
            if reversed_time is None:
                reversed_time = _reversed_indices(w, x, steps)
            flip = reversed_time
            inputs[0] = w.op("Gather", [x, flip], axis=0)
        names = [
            w.fresh(f"{kind}.out{k}") if _output(node, k) else "" for k in range(len(node.outputs))
        ]
        attrs = {k: attributes.value(node, k) for k in node.attributes}
        attrs["direction"] = "forward"
        if activations is not None:
            attrs["activations"] = activations[d * per_direction : (d + 1) * per_direction]
        for key, values in (("activation_alpha", alpha), ("activation_beta", beta)):
            if values is not None:
                attrs[key] = values[d * per_direction : (d + 1) * per_direction]
        outs: list[ir.Value | None] = [
            v if v.name else None for v in w.ops(node.op_type, inputs, names, **attrs)
        ]
        y = outs[0]
        if flip is not None and y is not None:
            y = w.op("Gather", [y, flip], axis=0)
        outputs.append([y, *outs[1:]])
    for k, value in enumerate(node.outputs):
        final = value.name
        if not final:
            continue
        parts = [o[k] for o in outputs]  # each direction named its output k (final is set)
        present = [p for p in parts if p is not None]
        if len(present) == 1:
            w.op("Identity", present, out=final)
        else:
            w.op("Concat", present, out=final, axis=1 if k == 0 else 0)


def _reversed_indices(w: Writer, x: ir.Value, steps: int | None) -> ir.Value:
    """``[T-1, ..., 0]`` for the time axis (0) of ``x``: a constant for a static length (so
    shapes stay known).
    """
    if steps is not None:
        return w.ints(list(range(steps - 1, -1, -1)))
    length = w.squeeze(w.slice(w.op("Shape", [x]), [0], [1], [0]), [0])
    one = w.const(1, "int64")
    return w.index_range(w.op("Sub", [length, one]), w.const(-1, "int64"), w.const(-1, "int64"))


# ------------------------------------------------------------------ unrolling
class RecurrentAsElementary(NodeRewrite):
    """Unroll forward ``RNN`` nodes, and non-float32 ``GRU``/``LSTM`` nodes, over a static
    sequence length.
    """

    name = "recurrent_as_elementary"
    op_types = frozenset(_KINDS)

    def select(self, node: ir.Node) -> bool:
        return _supported(node) and _direction(node) == "forward"

    def rewrite(self, node: ir.Node, ctx: RewriteContext) -> Sequence[ir.Node] | NoMatch:
        return _unroll(node, ctx)


def _unroll(node: ir.Node, ctx: RewriteContext) -> list[ir.Node] | NoMatch:
    x = node.inputs[0]
    elem, shape = ctx.types.elem(x), ctx.types.shape(x)
    if x is None or elem is None or shape is None:
        return fail("the input's shape or element type is not known")
    if len(shape) != 3 or shape[0] is None:
        return fail("the input is not 3-D or its sequence length is not static")
    if node.op_type != "RNN" and elem == onnx.TensorProto.FLOAT:
        return fail(f"the input is float32: ONNX Runtime's {node.op_type}Training handles it")
    activations = [a.lower() for a in (_activations(node) or _DEFAULT_ACTIVATIONS[node.op_type])]
    if node.op_type == "RNN":
        if len(activations) != 1 or activations[0] not in _RNN_ACTIVATIONS:
            return fail(f"the activation is not one of {', '.join(_RNN_ACTIVATIONS.values())}")
    elif activations != _DEFAULT_ACTIVATIONS[node.op_type]:
        return fail("the activations are not the default ones")
    w = ctx.writer(_hint(node))
    _Unroller(w, node, shape[0], attributes.int_attribute(node, "hidden_size"), activations).write()
    return w.nodes


class _Unroller:
    """Writes one forward RNN/GRU/LSTM node as ``steps`` explicit time steps."""

    def __init__(
        self, w: Writer, node: ir.Node, steps: int, hidden: int, activations: list[str]
    ) -> None:
        self.w, self.node, self.steps, self.hidden = w, node, steps, hidden
        self.gates = _KINDS[node.op_type][0]
        self.activation = _RNN_ACTIVATIONS[activations[0]]

    def write(self) -> None:
        w, node, hidden, gates = self.w, self.node, self.hidden, self.gates
        size = gates * hidden
        x, weight, recurrence = node.inputs[0], node.inputs[1], node.inputs[2]
        assert x is not None and weight is not None and recurrence is not None  # required inputs
        weight_t = w.op("Transpose", [w.squeeze(weight, [0])], perm=[1, 0])  # [I, G*H]
        recurrence_t = w.op("Transpose", [w.squeeze(recurrence, [0])], perm=[1, 0])  # [H, G*H]
        projected = w.op("MatMul", [x, weight_t])  # [T, B, G*H]
        input_bias = recurrent_bias = None
        bias, initial_state = _input(node, 3), _input(node, 5)
        initial_cell, peephole = _input(node, 6), _input(node, 7)
        if bias is not None:
            input_bias, recurrent_bias = w.split(w.squeeze(bias, [0]), [size, size], 0)
            projected = w.op("Add", [projected, input_bias])
        state = w.squeeze(initial_state, [0]) if initial_state is not None else None
        cell = (
            w.squeeze(initial_cell, [0])
            if node.op_type == "LSTM" and initial_cell is not None
            else None
        )
        peepholes = None
        if node.op_type == "LSTM" and peephole is not None:
            peepholes = w.split(w.squeeze(peephole, [0]), [hidden] * 3, 0)  # i, o, f
        step_inputs = [w.squeeze(p, [0]) for p in w.split(projected, [1] * self.steps, 0)]
        states = []
        for t in range(self.steps):
            if node.op_type == "RNN":
                state = self._rnn_step(step_inputs[t], state, recurrence_t, recurrent_bias)
            elif node.op_type == "GRU":
                state = self._gru_step(step_inputs[t], state, recurrence_t, recurrent_bias)
            else:
                state, cell = self._lstm_step(
                    step_inputs[t], state, cell, recurrence_t, recurrent_bias, peepholes
                )
            states.append(state)
        y, y_h = _output(node, 0), _output(node, 1)
        if y:
            w.op("Concat", [w.unsqueeze(s, [0, 1]) for s in states], out=y, axis=0)
        if y_h:
            w.unsqueeze(states[-1], [0], out=y_h)
        y_c = _output(node, 2) if node.op_type == "LSTM" else None
        if y_c:
            assert cell is not None  # LSTM: every time step returns the cell state
            w.unsqueeze(cell, [0], out=y_c)

    def _recurrent(
        self, state: ir.Value | None, recurrence_t: ir.Value, bias: ir.Value | None
    ) -> ir.Value | None:
        """``state @ R^T + Rb`` (None when both terms vanish)."""
        term = self.w.op("MatMul", [state, recurrence_t]) if state is not None else None
        if bias is None:
            return term
        return bias if term is None else self.w.op("Add", [term, bias])

    def _rnn_step(
        self, xw: ir.Value, state: ir.Value | None, recurrence_t: ir.Value, bias: ir.Value | None
    ) -> ir.Value:
        total = self._recurrent(state, recurrence_t, bias)
        pre = xw if total is None else self.w.op("Add", [xw, total])
        return self.w.op(self.activation, [pre])

    def _gru_step(
        self, xw: ir.Value, state: ir.Value | None, recurrence_t: ir.Value, bias: ir.Value | None
    ) -> ir.Value:
        w, hidden = self.w, self.hidden
        linear_before_reset = attributes.int_attribute(self.node, "linear_before_reset", 0)
        xz, xr, xh = w.split(xw, [hidden] * 3, 1)
        hz = hr = hh = None
        if state is not None:
            hz, hr, hh = w.split(w.op("MatMul", [state, recurrence_t]), [hidden] * 3, 1)
        bz = br = bh = None
        if bias is not None:
            bz, br, bh = w.split(bias, [hidden] * 3, 0)
        z = w.op("Sigmoid", [self._sum(xz, hz, bz)])
        r = w.op("Sigmoid", [self._sum(xr, hr, br)])
        if linear_before_reset:
            inner = self._sum(hh, bh)
            candidate_pre = xh if inner is None else w.op("Add", [xh, w.op("Mul", [r, inner])])
        else:
            reset = None
            if state is not None:
                rh_t = w.slice(recurrence_t, [2 * hidden], [3 * hidden], [1])
                reset = w.op("MatMul", [w.op("Mul", [r, state]), rh_t])
            candidate_pre = self._sum(xh, reset, bh)
        candidate = w.op("Tanh", [candidate_pre])
        if state is None:  # H = (1 - z) * h~
            return w.op("Sub", [candidate, w.op("Mul", [z, candidate])])
        return w.op("Add", [candidate, w.op("Mul", [z, w.op("Sub", [state, candidate])])])

    def _lstm_step(
        self,
        xw: ir.Value,
        state: ir.Value | None,
        cell: ir.Value | None,
        recurrence_t: ir.Value,
        bias: ir.Value | None,
        peepholes: list[ir.Value] | None,
    ) -> tuple[ir.Value, ir.Value]:
        w, hidden = self.w, self.hidden
        total = self._recurrent(state, recurrence_t, bias)
        gates = xw if total is None else w.op("Add", [xw, total])
        gi, go, gf, gc = w.split(gates, [hidden] * 4, 1)
        if cell is not None and peepholes is not None:
            pi, _, pf = peepholes
            gi = w.op("Add", [gi, w.op("Mul", [pi, cell])])
            gf = w.op("Add", [gf, w.op("Mul", [pf, cell])])
        i = w.op("Sigmoid", [gi])
        candidate = w.op("Mul", [i, w.op("Tanh", [gc])])
        if cell is None:
            new_cell = candidate
        else:
            new_cell = w.op("Add", [w.op("Mul", [w.op("Sigmoid", [gf]), cell]), candidate])
        if peepholes is not None:
            po = peepholes[1]
            go = w.op("Add", [go, w.op("Mul", [po, new_cell])])
        return w.op("Mul", [w.op("Sigmoid", [go]), w.op("Tanh", [new_cell])]), new_cell

    @overload
    def _sum(self, first: ir.Value, /, *terms: ir.Value | None) -> ir.Value: ...
    @overload
    def _sum(self, *terms: ir.Value | None) -> ir.Value | None: ...
    def _sum(self, *terms: ir.Value | None) -> ir.Value | None:
        """The sum of the terms present (None when none is)."""
        present = [t for t in terms if t is not None]
        if not present:
            return None
        total = present[0]
        for term in present[1:]:
            total = self.w.op("Add", [total, term])
        return total
