"""LSTM layers in training: ``LSTMTraining`` as a forward ``Scan`` that also returns every cell
state, ``LSTMGrad`` as a reverse ``Scan`` that recomputes each step's gates (see
:mod:`onnxblocks.portable.recurrent` for the forms and limits both recurrent layers share).
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from onnxblocks.portable.lowering_context import (
    LoweringContext,
    inputs,
    name_of,
    outputs,
    unsupported,
)
from onnxblocks.portable.recurrent import (
    _body,
    _check,
    _gradients_out,
    _only_read_by,
    _Parts,
    _scan,
    _steps,
    _zero,
)


def lstm_training(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``LSTMTraining(X, W, R, B, _, H0, C0) -> Y, Y_h, Y_c, all cell states, (iofc)`` as a
    forward ``Scan``.
    """
    x, weight, recurrence, bias, sequence_lens, h0, c0, peephole = inputs(node, 8)
    hidden = _check(node, "LSTM", sequence_lens, peephole)
    y, y_h, y_c, cells, iofc = outputs(node, 5)
    _only_read_by(node, [iofc], "LSTMGrad")
    w = ctx.writer(node)
    p = _Parts(w, weight, recurrence, bias, 4, hidden)
    batch_hidden = w.concat([w.dim(x, 1), w.ints([hidden])])
    start = [
        w.squeeze(v, [0])
        if v is not None
        else w.op("ConstantOfShape", [batch_hidden], value=_zero(w, x))
        for v in (h0, c0)
    ]
    b = ctx.writer(node)
    s_h, s_c, x_t = b.body_input("h"), b.body_input("c"), b.body_input("x")
    bias_sum = b.op("Add", [p.wb, p.rb])
    gates = b.op(
        "Add", [b.op("Add", [b.op("MatMul", [x_t, p.wt]), b.op("MatMul", [s_h, p.rt])]), bias_sum]
    )
    i, o, f, g = b.split(gates, [hidden] * 4, 1)
    i, o, f, g = b.op("Sigmoid", [i]), b.op("Sigmoid", [o]), b.op("Sigmoid", [f]), b.op("Tanh", [g])
    c = b.op("Add", [b.op("Mul", [f, s_c]), b.op("Mul", [i, g])])
    h = b.op("Mul", [o, b.op("Tanh", [c])])
    h_out, c_out = b.op("Identity", [h]), b.op("Identity", [c])
    body = _body(b, "lstm_step", [s_h, s_c, x_t], [h, c, h_out, c_out])
    finals = _scan(
        w, body, start, [x], [w.fresh(n) for n in ("h", "c", "hall", "call")], reverse=False
    )
    for out, value, axis in (
        (y, finals[2], 1),
        (y_h, finals[0], 0),
        (y_c, finals[1], 0),
        (cells, finals[3], 1),
    ):
        if out:
            w.unsqueeze(value, [axis], out)
    return w.nodes


def lstm_grad(node: ir.Node, ctx: LoweringContext) -> list[ir.Node]:
    """``LSTMGrad(X, W, R, _, H0, C0, Y, cells, iofc, dY, dY_h, dY_c) -> dX, dW, dR, dB, dH0,
    dC0``, a reverse Scan.
    """
    x, weight, recurrence, sequence_lens, h0, c0, hall, cells, _, dhall, dh_final, dc_final = (
        inputs(node, 12)
    )
    hidden = _check(node, "LSTM", sequence_lens)
    dx, dw, dr, db, dh0, dc0, dp = outputs(node, 7)
    if dp:
        raise unsupported(node, "peephole weights")
    forward = ctx.original_producers.get(name_of(hall))
    if forward is None or forward.op_type != "LSTMTraining":
        raise unsupported(
            node, f"all hidden states '{name_of(hall)}' not written by an LSTMTraining node"
        )
    original = ctx.original_inputs(forward)
    bias = original[3] if len(original) > 3 else None
    w = ctx.writer(node)
    p = _Parts(w, weight, recurrence, bias, 4, hidden)
    batch_hidden = w.concat([w.dim(x, 1), w.ints([hidden])])
    h_prev_all = _steps(w, hall, h0, batch_hidden)
    c_prev_all = _steps(w, cells, c0, batch_hidden)
    d_steps = (
        w.squeeze(dhall, [1])
        if dhall is not None
        else w.op("ConstantOfShape", [w.shape(h_prev_all)], value=_zero(w, x))
    )

    b = ctx.writer(node)
    s_dh, s_dc, s_dw, s_dr, s_db, x_t, h_prev, c_prev, dy_t = (
        b.body_input(n) for n in ("dh", "dc", "dw", "dr", "db", "x", "h", "c", "dy")
    )
    one = b.scalar(1, onnx.TensorProto.FLOAT)
    bias_sum = b.op("Add", [p.wb, p.rb])
    gates = b.op(
        "Add",
        [b.op("Add", [b.op("MatMul", [x_t, p.wt]), b.op("MatMul", [h_prev, p.rt])]), bias_sum],
    )
    i, o, f, g = b.split(gates, [hidden] * 4, 1)
    i, o, f, g = b.op("Sigmoid", [i]), b.op("Sigmoid", [o]), b.op("Sigmoid", [f]), b.op("Tanh", [g])
    c = b.op("Add", [b.op("Mul", [f, c_prev]), b.op("Mul", [i, g])])
    tc = b.op("Tanh", [c])
    d_h = b.op("Add", [s_dh, dy_t])
    d_c = b.op(
        "Add",
        [s_dc, b.op("Mul", [b.op("Mul", [d_h, o]), b.op("Sub", [one, b.op("Mul", [tc, tc])])])],
    )

    def sigmoid_back(grad: ir.Value, gate: ir.Value) -> ir.Value:
        return b.op("Mul", [b.op("Mul", [grad, gate]), b.op("Sub", [one, gate])])

    di = sigmoid_back(b.op("Mul", [d_c, g]), i)
    do = sigmoid_back(b.op("Mul", [d_h, tc]), o)
    df = sigmoid_back(b.op("Mul", [d_c, c_prev]), f)
    dg = b.op("Mul", [b.op("Mul", [d_c, i]), b.op("Sub", [one, b.op("Mul", [g, g])])])
    dgates = b.concat([di, do, df, dg], 1)
    dc_prev = b.op("Mul", [d_c, f])
    dh_prev = b.op("MatMul", [dgates, p.r2])
    new_dw = b.op("Add", [s_dw, b.op("MatMul", [b.op("Transpose", [dgates]), x_t])])
    new_dr = b.op("Add", [s_dr, b.op("MatMul", [b.op("Transpose", [dgates]), h_prev])])
    new_db = b.op("Add", [s_db, b.reduce("ReduceSum", dgates, [0], keepdims=0)])
    dx_t = b.op("MatMul", [dgates, p.w2])
    body = _body(
        b,
        "lstm_grad_step",
        [s_dh, s_dc, s_dw, s_dr, s_db, x_t, h_prev, c_prev, dy_t],
        [dh_prev, dc_prev, new_dw, new_dr, new_db, dx_t],
    )

    starts = [
        w.squeeze(v, [0])
        if v is not None
        else w.op("ConstantOfShape", [batch_hidden], value=_zero(w, x))
        for v in (dh_final, dc_final)
    ]
    zeros = [w.op("ConstantOfShape", [w.shape(v)], value=_zero(w, x)) for v in (p.w2, p.r2, p.wb)]
    names = [w.fresh(n) for n in ("dh0", "dc0", "dw", "dr", "db", "dx")]
    finals = _scan(
        w, body, [*starts, *zeros], [x, h_prev_all, c_prev_all, d_steps], names, reverse=True
    )
    # finals: dh0, dc0, dW, dR, dB, dX -> the GRU layout [dh0, dW, dR, ...] for _gradients_out
    _gradients_out(
        w,
        [finals[0], finals[2], finals[3], finals[5]],
        dx,
        dw,
        dr,
        db,
        dh0,
        bias_parts=(finals[4], finals[4]),
    )
    if dc0:
        w.unsqueeze(finals[1], [0], dc0)
    return w.nodes


LOWERINGS = {
    "LSTMTraining": lstm_training,
    "LSTMGrad": lstm_grad,
}
