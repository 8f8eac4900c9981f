"""Recurrent ops (RNN, GRU, LSTM) in forms ONNX Runtime 1.19.2 can train on CPU.

ONNX Runtime trains ``GRU`` and ``LSTM`` with its own kernels (``GRUTraining``,
``LSTMTraining``), which run the forward direction only, in float32 only; ``RNN``
has no gradient builder at all. The torch exporters emit
``direction="bidirectional"`` for ``bidirectional=True``, double-precision nodes
for ``.double()`` models and ``RNN`` for ``nn.RNN`` (torchscript exporter).

* :func:`recurrent_directions_as_forward` splits a ``reverse`` or
  ``bidirectional`` node into forward nodes: the reverse direction runs on the
  time-reversed input (``Gather`` with indices ``T-1 ... 0``) and its output is
  reversed back; the directions' outputs are concatenated as the original node
  stacks them. Each direction's weights are ``Slice`` s of the original ones, so
  gradients reach the same parameters.
* :func:`recurrent_as_elementary` unrolls forward ``RNN`` nodes, and ``GRU`` /
  ``LSTM`` nodes that are not float32, over a static sequence length into
  ``MatMul``, ``Sigmoid``, ``Tanh``... following the ONNX equations.

Nodes with ``sequence_lens``, ``layout=1``, ``clip`` or non-default activations are
left as they are.
"""

from __future__ import annotations

from typing import overload

import onnx

from onnxblocks.gradient import _graph

#: op type -> (gates, activations per direction)
_KINDS = {"RNN": (1, 1), "GRU": (3, 2), "LSTM": (4, 3)}
_DEFAULT_ACTIVATIONS = {"RNN": ["tanh"], "GRU": ["sigmoid", "tanh"], "LSTM": ["sigmoid", "tanh", "tanh"]}
_RNN_ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu", "sigmoid": "Sigmoid"}


def _input(node: onnx.NodeProto, index: int) -> str | None:
    return node.input[index] if len(node.input) > index and node.input[index] else None


def _output(node: onnx.NodeProto, index: int) -> str | None:
    return node.output[index] if len(node.output) > index and node.output[index] else None


def _direction(node: onnx.NodeProto) -> str:
    return _graph.string_attribute(node, "direction", "forward")


def _activations(node: onnx.NodeProto) -> list[str] | None:
    return _graph.strings_attribute(node, "activations", None)


def _supported(node: onnx.NodeProto) -> bool:
    """Common preconditions of both rewrites."""
    return (
        _graph.is_default_domain(node)
        and node.op_type in _KINDS
        and _input(node, 4) is None  # sequence_lens
        and _graph.int_attribute(node, "layout", 0) == 0
        and _graph.attribute(node, "clip") is None
        and not _graph.int_attribute(node, "input_forget", 0)
    )


# ------------------------------------------------------------------ directions
def recurrent_directions_as_forward(model: onnx.ModelProto) -> int:
    """Split ``reverse`` and ``bidirectional`` RNN/GRU/LSTM nodes into forward-direction nodes.

    Returns:
        The number of nodes rewritten.
    """
    return _graph.rewrite_nodes(model, lambda n: _supported(n) and _direction(n) != "forward", _forward_directions)


def _forward_directions(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    names, types, opset = ctx.names, ctx.types, ctx.opset
    w = _graph.NodeWriter(names, opset, node.output[0] or node.name or node.op_type)
    shape = _graph.shape_of(types, node.input[0])
    _split_directions(w, node, shape[0] if shape else None)
    return w.nodes


def _split_directions(w: _graph.NodeWriter, node: onnx.NodeProto, steps: int | None) -> None:
    direction = _direction(node)
    kinds = ["forward", "reverse"] if direction == "bidirectional" else ["reverse"]
    per_direction = _KINDS[node.op_type][1]
    activations = _activations(node)
    alpha = _graph.floats_attribute(node, "activation_alpha", None)
    beta = _graph.floats_attribute(node, "activation_beta", None)
    x = node.input[0]
    reversed_time = None
    outputs: list[list[str]] = []  # per direction: Y, Y_h, (Y_c); "" where absent
    for d, kind in enumerate(kinds):
        inputs = list(node.input)
        # weights, biases, initial states and peepholes: this direction's slice along axis 0
        for i in (1, 2, 3, 5, 6, 7):
            if _input(node, i) is not None and len(kinds) > 1:
                inputs[i] = w.slice(node.input[i], [d], [d + 1], [0])
        flip = None  # the time-reversal indices when this direction runs reversed
        if kind == "reverse":
            if reversed_time is None:
                reversed_time = _reversed_indices(w, x, steps)
            flip = reversed_time
            inputs[0] = w.op("Gather", [x, flip], axis=0)
        outs = [w.fresh(f"{kind}.out{k}") if _output(node, k) else "" for k in range(len(node.output))]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        attrs["direction"] = "forward"
        if activations is not None:
            attrs["activations"] = activations[d * per_direction : (d + 1) * per_direction]
        for key, values in (("activation_alpha", alpha), ("activation_beta", beta)):
            if values is not None:
                attrs[key] = values[d * per_direction : (d + 1) * per_direction]
        w.ops(node.op_type, inputs, outs, **attrs)
        y = outs[0]
        if flip is not None and y:
            y = w.op("Gather", [y, flip], axis=0)
        outputs.append([y, *outs[1:]])
    for k, final in enumerate(node.output):
        if not final:
            continue
        parts = [o[k] for o in outputs]  # not "": each direction named its output k (final is set)
        if len(parts) == 1:
            w.op("Identity", [parts[0]], out=final)
        else:
            w.op("Concat", parts, out=final, axis=1 if k == 0 else 0)


def _reversed_indices(w: _graph.NodeWriter, x: str, steps: int | None) -> str:
    """``[T-1, ..., 0]`` for the time axis (0) of ``x``: a constant for a static length (so shapes stay known)."""
    if steps is not None:
        return w.ints(list(range(steps - 1, -1, -1)))
    length = w.squeeze(w.slice(w.op("Shape", [x]), [0], [1], [0]), [0])
    one = w.const(1, "int64")
    return w.index_range(w.op("Sub", [length, one]), w.const(-1, "int64"), w.const(-1, "int64"))


# ------------------------------------------------------------------ unrolling
def recurrent_as_elementary(model: onnx.ModelProto) -> int:
    """Unroll forward ``RNN`` nodes, and non-float32 ``GRU``/``LSTM`` nodes, over a static sequence length.

    Returns:
        The number of nodes rewritten.
    """
    return _graph.rewrite_nodes(model, lambda n: _supported(n) and _direction(n) == "forward", _unroll)


def _unroll(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    x = node.input[0]
    elem, shape = _graph.elem_type(ctx.types, x), _graph.shape_of(ctx.types, x)
    if elem is None or shape is None or len(shape) != 3 or shape[0] is None:
        return None
    if node.op_type != "RNN" and elem == onnx.TensorProto.FLOAT:
        return None  # ONNX Runtime's GRUTraining / LSTMTraining handle it
    activations = [a.lower() for a in (_activations(node) or _DEFAULT_ACTIVATIONS[node.op_type])]
    if node.op_type == "RNN":
        if len(activations) != 1 or activations[0] not in _RNN_ACTIVATIONS:
            return None
    elif activations != _DEFAULT_ACTIVATIONS[node.op_type]:
        return None
    w = ctx.writer(node.output[0] or node.name or node.op_type)
    _Unroller(w, node, shape[0], _graph.int_attribute(node, "hidden_size"), activations).write()
    return w.nodes


class _Unroller:
    """Writes one forward RNN/GRU/LSTM node as ``steps`` explicit time steps."""

    def __init__(
        self, w: _graph.NodeWriter, node: onnx.NodeProto, steps: int, hidden: int, activations: list[str]
    ) -> None:
        self.w, self.node, self.steps, self.hidden = w, node, steps, hidden
        self.gates = _KINDS[node.op_type][0]
        self.activation = _RNN_ACTIVATIONS[activations[0]]

    def write(self) -> None:
        w, node, hidden, gates = self.w, self.node, self.hidden, self.gates
        size = gates * hidden
        x = node.input[0]
        weight_t = w.op("Transpose", [w.squeeze(node.input[1], [0])], perm=[1, 0])  # [I, G*H]
        recurrence_t = w.op("Transpose", [w.squeeze(node.input[2], [0])], perm=[1, 0])  # [H, G*H]
        projected = w.op("MatMul", [x, weight_t])  # [T, B, G*H]
        input_bias = recurrent_bias = None
        if _input(node, 3):
            input_bias, recurrent_bias = w.split(w.squeeze(node.input[3], [0]), [size, size], 0)
            projected = w.op("Add", [projected, input_bias])
        state = w.squeeze(node.input[5], [0]) if _input(node, 5) else None
        cell = w.squeeze(node.input[6], [0]) if node.op_type == "LSTM" and _input(node, 6) else None
        peepholes = None
        if node.op_type == "LSTM" and _input(node, 7):
            peepholes = w.split(w.squeeze(node.input[7], [0]), [hidden] * 3, 0)  # i, o, f
        step_inputs = [w.squeeze(p, [0]) for p in w.split(projected, [1] * self.steps, 0)]
        states = []
        for t in range(self.steps):
            if node.op_type == "RNN":
                state = self._rnn_step(step_inputs[t], state, recurrence_t, recurrent_bias)
            elif node.op_type == "GRU":
                state = self._gru_step(step_inputs[t], state, recurrence_t, recurrent_bias)
            else:
                state, cell = self._lstm_step(step_inputs[t], state, cell, recurrence_t, recurrent_bias, peepholes)
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

    def _recurrent(self, state: str | None, recurrence_t: str, bias: str | None) -> str | None:
        """``state @ R^T + Rb`` (None when both terms vanish)."""
        term = self.w.op("MatMul", [state, recurrence_t]) if state is not None else None
        if bias is None:
            return term
        return bias if term is None else self.w.op("Add", [term, bias])

    def _rnn_step(self, xw: str, state: str | None, recurrence_t: str, bias: str | None) -> str:
        total = self._recurrent(state, recurrence_t, bias)
        pre = xw if total is None else self.w.op("Add", [xw, total])
        return self.w.op(self.activation, [pre])

    def _gru_step(self, xw: str, state: str | None, recurrence_t: str, bias: str | None) -> str:
        w, hidden = self.w, self.hidden
        linear_before_reset = _graph.int_attribute(self.node, "linear_before_reset", 0)
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
        xw: str,
        state: str | None,
        cell: str | None,
        recurrence_t: str,
        bias: str | None,
        peepholes: list[str] | None,
    ) -> tuple[str, str]:
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
    def _sum(self, first: str, /, *terms: str | None) -> str: ...
    @overload
    def _sum(self, *terms: str | None) -> str | None: ...
    def _sum(self, *terms: str | None) -> str | None:
        """The sum of the terms present (None when none is)."""
        present = [t for t in terms if t is not None]
        if not present:
            return None
        total = present[0]
        for term in present[1:]:
            total = self.w.op("Add", [total, term])
        return total
