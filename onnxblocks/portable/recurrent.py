"""Recurrent layers in training: ``GRUTraining`` / ``GRUGrad`` here, and the Scan helpers
:mod:`onnxblocks.portable.lstm` shares for ``LSTMTraining`` / ``LSTMGrad``.

ONNX Runtime's training kernels stash the gates of every step for the backward
pass. The standard forms recompute them instead, one step at a time:

* ``GRUTraining`` is the standard ``GRU`` (its gates output is read by ``GRUGrad`` only).
* ``LSTMTraining`` is a forward ``Scan`` that also returns every cell state.
* ``GRUGrad`` and ``LSTMGrad`` are reverse ``Scan`` s over the steps: each step
  recomputes its gates from ``x_t`` and the previous state, back-propagates the
  step, and adds its weight gradients to the loop-carried sums.

Forward direction, default activations, no ``sequence_lens``, ``clip`` or
peepholes (the normalisation passes split other directions into forward nodes).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks.portable.lowering_context import (
    FLOAT_TENSOR,
    LoweringContext,
    Writer,
    attributes,
    inputs,
    outputs,
    unsupported,
)

_DEFAULTS = {"GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _check(
    node: ir.Node, kind: str, sequence_lens: ir.Value | None, peephole: ir.Value | None = None
) -> int:
    """The hidden size, after checking the node is in the covered form."""
    if node.attributes.get_string("direction", "forward") != "forward":
        raise unsupported(node, "a reverse or bidirectional direction")
    activations = node.attributes.get_strings("activations", None)
    if activations and [a.lower() for a in activations] != [a.lower() for a in _DEFAULTS[kind]]:
        raise unsupported(node, f"activations {activations}")
    if node.attributes.get_float("clip", None) is not None:
        raise unsupported(node, "clip")
    if node.attributes.get_int("input_forget", 0):
        raise unsupported(node, "input_forget=1")
    if sequence_lens is not None or peephole is not None:
        raise unsupported(node, "sequence_lens or peephole weights")
    hidden = node.attributes.get_int("hidden_size", None)
    if hidden is None:
        raise unsupported(node, "a node without hidden_size")
    return hidden


def _only_read_by(node: ir.Node, names: list[str], grad_op: str) -> None:
    for value in node.outputs:
        if not value.name or value.name not in names:
            continue
        readers = [use.node for use in value.uses() if use.node.op_type != grad_op]
        if readers:
            raise unsupported(
                node,
                f"its output '{value.name}' read by {readers[0].op_type} (only {grad_op} may "
                "read it)",
            )


class _Parts:
    """Weights of one direction split per gate: ``W [G*H, I]``, ``R [G*H, H]``, ``Wb``, ``Rb``
    (``[G*H]``).
    """

    def __init__(
        self,
        w: Writer,
        weight: ir.Value,
        recurrence: ir.Value,
        bias: ir.Value | None,
        gates: int,
        hidden: int,
    ) -> None:
        self.w2 = w.squeeze(weight, [0])
        self.r2 = w.squeeze(recurrence, [0])
        self.wt, self.rt = w.op("Transpose", [self.w2]), w.op("Transpose", [self.r2])
        if bias is not None:
            self.wb, self.rb = w.split(w.squeeze(bias, [0]), [gates * hidden, gates * hidden], 0)
        else:
            zeros = w.op("ConstantOfShape", [w.ints([gates * hidden])], value=_zero(w, weight))
            self.wb = self.rb = zeros


def _zero(w: Writer, like: ir.Value | None) -> ir.TensorProtocol:
    del w, like
    return ir.tensor(np.zeros(1, np.float32), name="zero")


def _steps(w: Writer, hall: ir.Value, first: ir.Value | None, batch_hidden: ir.Value) -> ir.Value:
    """``[first, hall[0], ..., hall[T-2]]``: each step's previous state, ``[T, B, H]``."""
    sequence = w.squeeze(hall, [1])
    start = (
        w.squeeze(first, [0])
        if first is not None
        else w.op("ConstantOfShape", [batch_hidden], value=_zero(w, hall))
    )
    earlier = w.op("Slice", [sequence, w.ints([0]), w.ints([-1]), w.ints([0])])
    return w.concat([w.unsqueeze(start, [0]), earlier], 0)


def _scan(
    w: Writer,
    body: ir.Graph,
    states: list[ir.Value],
    scanned: list[ir.Value | None],
    outputs_: list[str],
    reverse: bool,
) -> list[ir.Value]:
    """A ``Scan`` over ``body``; returns its outputs (named ``outputs_``)."""
    direction = [1 if reverse else 0]
    return w.ops(
        "Scan",
        [*states, *scanned],
        outputs_,
        body=body,
        num_scan_inputs=len(scanned),
        scan_input_directions=direction * len(scanned),
        scan_output_directions=direction * (len(outputs_) - len(states)),
    )


def _body(w: Writer, name: str, ins: list[ir.Value], outs: list[ir.Value]) -> ir.Graph:
    """A Scan body over float tensors of unknown shape (its inputs from
    :meth:`Writer.body_input`).
    """
    for value in outs:
        value.type = FLOAT_TENSOR
    return ir.Graph(ins, outs, nodes=w.nodes, name=name)


def gru_training(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``GRUTraining(X, W, R, B, _, H0) -> Y, Y_h, zrh``: the standard ``GRU`` (zrh is left to
    ``GRUGrad``).
    """
    x, weight, recurrence, bias, sequence_lens, h0 = inputs(node, 6)
    _check(node, "GRU", sequence_lens)
    y, y_h, zrh = outputs(node, 3)
    _only_read_by(node, [zrh], "GRUGrad")
    w = ctx.writer(node)
    attrs = attributes(
        node, "hidden_size", "linear_before_reset", "direction", "activations", "layout"
    )
    w.ops("GRU", [x, weight, recurrence, bias, None, h0], [y, y_h], **attrs)
    return w.nodes


def gru_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``GRUGrad(X, W, R, B, _, H0, Y, zrh, dY, dY_h) -> dX, dW, dR, dB, dH0`` as a reverse
    ``Scan``.
    """
    x, weight, recurrence, bias, sequence_lens, h0, hall, _, dhall, dh_final = inputs(node, 10)
    hidden = _check(node, "GRU", sequence_lens)
    before_reset = node.attributes.get_int("linear_before_reset", 0)
    dx, dw, dr, db, dh0 = outputs(node, 5)
    w = ctx.writer(node)
    p = _Parts(w, weight, recurrence, bias, 3, hidden)
    rzr_t, rh_t = w.split(p.rt, [2 * hidden, hidden], 1)  # [H, 2H], [H, H]
    rzr, rh = w.split(p.r2, [2 * hidden, hidden], 0)
    rb_zr, rb_h = w.split(p.rb, [2 * hidden, hidden], 0)
    batch_hidden = w.concat([w.dim(x, 1), w.ints([hidden])])
    previous = _steps(w, hall, h0, batch_hidden)
    d_steps = (
        w.squeeze(dhall, [1])
        if dhall is not None
        else w.op("ConstantOfShape", [w.shape(previous)], value=_zero(w, x))
    )

    b = ctx.writer(node)  # the body: state dh, dW, dR, dWb, dRb; scanned x_t, h_t-1, dy_t
    s_dh, s_dw, s_dr, s_dwb, s_drb, x_t, h_prev, dy_t = (
        b.body_input(n) for n in ("dh", "dw", "dr", "dwb", "drb", "x", "h", "dy")
    )
    gx = b.op("Add", [b.op("MatMul", [x_t, p.wt]), p.wb])
    gx_zr, gx_h = b.split(gx, [2 * hidden, hidden], 1)
    zr = b.op(
        "Sigmoid", [b.op("Add", [gx_zr, b.op("Add", [b.op("MatMul", [h_prev, rzr_t]), rb_zr])])]
    )
    z, r = b.split(zr, [hidden, hidden], 1)
    one = b.scalar(1, onnx.TensorProto.FLOAT)
    if before_reset:
        linear = b.op("Add", [b.op("MatMul", [h_prev, rh_t]), rb_h])
        n = b.op("Tanh", [b.op("Add", [gx_h, b.op("Mul", [r, linear])])])
    else:
        reset = b.op("Mul", [r, h_prev])
        n = b.op("Tanh", [b.op("Add", [gx_h, b.op("Add", [b.op("MatMul", [reset, rh_t]), rb_h])])])
    d_h = b.op("Add", [s_dh, dy_t])
    dn_pre = b.op(
        "Mul", [b.op("Mul", [d_h, b.op("Sub", [one, z])]), b.op("Sub", [one, b.op("Mul", [n, n])])]
    )
    dz = b.op("Mul", [d_h, b.op("Sub", [h_prev, n])])
    dz_pre = b.op("Mul", [b.op("Mul", [dz, z]), b.op("Sub", [one, z])])
    dh_prev = b.op("Mul", [d_h, z])
    if before_reset:
        d_linear = b.op("Mul", [dn_pre, r])
        d_r = b.op("Mul", [dn_pre, linear])
        dh_prev = b.op("Add", [dh_prev, b.op("MatMul", [d_linear, rh])])
        drh = b.op("MatMul", [b.op("Transpose", [d_linear]), h_prev])
        drb_h = b.reduce("ReduceSum", d_linear, [0], keepdims=0)
    else:
        d_reset = b.op("MatMul", [dn_pre, rh])
        d_r = b.op("Mul", [d_reset, h_prev])
        dh_prev = b.op("Add", [dh_prev, b.op("Mul", [d_reset, r])])
        drh = b.op("MatMul", [b.op("Transpose", [dn_pre]), reset])
        drb_h = b.reduce("ReduceSum", dn_pre, [0], keepdims=0)
    dr_pre = b.op("Mul", [b.op("Mul", [d_r, r]), b.op("Sub", [one, r])])
    dzr = b.concat([dz_pre, dr_pre], 1)
    dgates = b.concat([dzr, dn_pre], 1)
    dh_prev = b.op("Add", [dh_prev, b.op("MatMul", [dzr, rzr])])
    new_dw = b.op("Add", [s_dw, b.op("MatMul", [b.op("Transpose", [dgates]), x_t])])
    dzr_rec = b.op("MatMul", [b.op("Transpose", [dzr]), h_prev])
    new_dr = b.op("Add", [s_dr, b.concat([dzr_rec, drh], 0)])
    new_dwb = b.op("Add", [s_dwb, b.reduce("ReduceSum", dgates, [0], keepdims=0)])
    new_drb = b.op(
        "Add", [s_drb, b.concat([b.reduce("ReduceSum", dzr, [0], keepdims=0), drb_h], 0)]
    )
    dx_t = b.op("MatMul", [dgates, p.w2])
    body = _body(
        b,
        "gru_grad_step",
        [s_dh, s_dw, s_dr, s_dwb, s_drb, x_t, h_prev, dy_t],
        [dh_prev, new_dw, new_dr, new_dwb, new_drb, dx_t],
    )

    start_dh = (
        w.squeeze(dh_final, [0])
        if dh_final is not None
        else w.op("ConstantOfShape", [batch_hidden], value=_zero(w, x))
    )
    zeros = [
        w.op("ConstantOfShape", [w.shape(v)], value=_zero(w, x)) for v in (p.w2, p.r2, p.wb, p.rb)
    ]
    names = [w.fresh(n) for n in ("dh0", "dw", "dr", "dwb", "drb", "dx")]
    finals = _scan(w, body, [start_dh, *zeros], [x, previous, d_steps], names, reverse=True)
    _gradients_out(w, finals, dx, dw, dr, db, dh0, bias_parts=(finals[3], finals[4]))
    return w.nodes


def _gradients_out(
    w: Writer,
    finals: list[ir.Value],
    dx: str,
    dw: str,
    dr: str,
    db: str,
    dh0: str,
    bias_parts: tuple[ir.Value, ir.Value],
) -> None:
    """Write the gradient outputs from the Scan's final states (``[dh0, dW, dR, ...]`` then
    ``dX``).
    """
    if dx:
        w.op("Identity", [finals[-1]], dx)
    if dw:
        w.unsqueeze(finals[1], [0], dw)
    if dr:
        w.unsqueeze(finals[2], [0], dr)
    if db:
        w.unsqueeze(w.concat(list(bias_parts), 0), [0], db)
    if dh0:
        w.unsqueeze(finals[0], [0], dh0)


LOWERINGS = {
    "GRUTraining": gru_training,
    "GRUGrad": gru_grad,
}
