"""Cross entropy over a large vocabulary in chunks of tokens, its gradient written by hand.

``CrossEntropyLoss(chunk_size=N)`` builds this instead of ``SoftmaxCrossEntropyLoss``. The
rows (tokens) are split into chunks of ``N``; a ``Loop`` computes, chunk by chunk, the loss
and its gradient with respect to the rows:

* on logits ``[M, V]``: ``g_i = s_i * (softmax(z_i) - onehot(y_i))`` (``[M, V]``, the gradient
  of the logits, which the head's backward needs anyway);
* on hidden states ``[M, H]`` with the head's weight ``W`` (``head_weight``): the chunk's logits
  ``h_c W^T`` exist only inside the loop, and the gradient of the rows is
  ``g_c W`` (``[M, H]``): the whole ``[M, V]`` logits, probabilities and their gradients
  are never held. Ignored rows are gathered out before the head, so they cost nothing.

``s_i`` is the row's share of the loss: ``w_i / sum_j w_j`` for ``"mean"``, ``w_i`` for ``"sum"``
(``w_i``: the class weight of the label, 0 when ignored). The loss is then::

    loss = stop(sum_i s_i * nll_i) + (sum(x * stop(g)) - stop(sum(x * g)))

where ``x`` are the rows: the bracket is exactly zero (the same ops on the same numbers) and
its gradient with respect to ``x`` is ``g``. ``stop`` is an ``Identity`` named
``onnxblocks.stop_gradient`` that ONNX Runtime's gradient builder does not differentiate through
(:mod:`onnxblocks.gradient.stop_gradient`), so it never sees the ``Loop``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from onnxblocks._core.contracts import STOP_GRADIENT_NODE
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.value import Value

__all__ = ["ChunkPlan", "chunked_cross_entropy"]


@dataclass(frozen=True)
class ChunkPlan:
    """What the chunked loss computes over.

    Attributes:
        rows: ``[M, D]``: the logits (``D = V``) or the hidden states (``D = H``) of the counted
            rows.
        labels: ``[M]`` class indices, each in range (ignored ones already replaced or removed).
        share: ``[M]`` each row's share ``s_i`` of the loss (0 for an ignored row).
        empty: A bool scalar, true when no row counts in a ``"mean"`` (the loss is then NaN);
            None otherwise.
        head: The head weight (``[V, H]``, or ``[H, V]`` when ``head_in_out``); None on logits.
        head_in_out: The head weight's layout is ``[in, out]``.
        chunk_size: Rows per chunk.
        width: ``D``, the rows' static last dim.
    """

    rows: Value
    labels: Value
    share: Value
    empty: Value | None
    head: str | None
    head_in_out: bool
    chunk_size: int
    width: int


class _Body:
    """The loop body's nodes, named from the outer model's names (subgraphs shadow nothing)."""

    def __init__(self, acc: ModelAccessor, version: int) -> None:
        self.acc, self.version = acc, version
        self.nodes: list = []

    def op(self, op_type: str, inputs: list[str], **attributes: object) -> str:
        out = self.acc.names.fresh(f"chunk_{op_type.lower()}")
        node = helper.make_node(
            op_type, inputs, [out], name=self.acc.names.fresh(f"chunk_{op_type}")
        )
        node.attribute.extend(
            helper.make_attribute(k, v) for k, v in attributes.items() if v is not None
        )
        self.nodes.append(node)
        return out

    def axes(self, op_type: str, x: str, axes: list[int], **attributes: object) -> str:
        since = {"Unsqueeze": 13, "Squeeze": 13, "ReduceSum": 13}.get(op_type, 18)
        if self.version >= since:
            return self.op(op_type, [x, self.const(axes)], **attributes)
        return self.op(op_type, [x], axes=axes, **attributes)

    def const(self, values: list[int]) -> str:
        return str(self.acc.constant(np.array(values, dtype=np.int64), name_hint="chunk_axes"))


def _body(plan: ChunkPlan, acc: ModelAccessor, count: str, elem: int) -> tuple[object, str]:
    """The ``Loop`` body: ``(i, cond, loss) -> (cond, loss + loss_c, pad(g_c))``."""
    version = acc.domain_version("") or 13
    b = _Body(acc, version)
    step, cond, total = (acc.names.fresh(n) for n in ("chunk_i", "chunk_cond", "chunk_total"))
    size = str(acc.constant(np.array([plan.chunk_size], np.int64), name_hint="chunk_size"))
    start = b.op("Mul", [b.axes("Unsqueeze", step, [0]), size])
    end = b.op("Min", [b.op("Add", [start, size]), count])
    axis0 = b.const([0])
    rows = b.op("Slice", [str(plan.rows), start, end, axis0])
    labels = b.axes("Unsqueeze", b.op("Slice", [str(plan.labels), start, end, axis0]), [1])
    share = b.axes("Unsqueeze", b.op("Slice", [str(plan.share), start, end, axis0]), [1])
    if plan.head is None:
        logits = rows
    elif plan.head_in_out:
        logits = b.op("MatMul", [rows, plan.head])
    else:
        logits = b.op("Gemm", [rows, plan.head], transB=1)
    lse = b.axes("ReduceLogSumExp", logits, [1], keepdims=1)
    picked = b.op("GatherElements", [logits, labels], axis=1)
    nll = b.op("Mul", [b.op("Sub", [lse, picked]), share])
    new_total = b.op("Add", [total, b.axes("ReduceSum", nll, [0, 1], keepdims=0)])
    weighted = b.op("Mul", [b.op("Exp", [b.op("Sub", [logits, lse])]), share])
    if plan.head is None:
        at_label = b.op("Sub", [b.op("GatherElements", [weighted, labels], axis=1), share])
        grad = b.op("ScatterElements", [weighted, labels, at_label], axis=1)
    else:
        flat = b.axes("Squeeze", labels, [1])
        if plan.head_in_out:  # [H, c] first: the head's columns of the labels
            spread = b.op("Gemm", [plan.head, weighted], transB=1)
            label_columns = b.op("Gather", [plan.head, flat], axis=1)
            shares = b.op("Transpose", [share], perm=[1, 0])
            columns = b.op("Sub", [spread, b.op("Mul", [label_columns, shares])])
            grad = b.op("Transpose", [columns], perm=[1, 0])
        else:
            spread = b.op("MatMul", [weighted, plan.head])
            label_rows = b.op("Gather", [plan.head, flat], axis=0)
            grad = b.op("Sub", [spread, b.op("Mul", [label_rows, share])])
    missing = b.op("Sub", [size, b.op("Sub", [end, start])])
    # [0, 0, missing, 0]; not a Concat, which ONNX Runtime's optimizer makes a ConcatTraining
    pads = b.op("Mul", [missing, b.const([0, 0, 1, 0])])
    padded = b.op("Pad", [grad, pads])
    cond_out = b.op("Identity", [cond])
    scalar = helper.make_tensor_value_info
    graph = helper.make_graph(
        b.nodes,
        acc.names.fresh("chunk_body"),
        [
            scalar(step, TensorProto.INT64, []),
            scalar(cond, TensorProto.BOOL, []),
            scalar(total, elem, []),
        ],
        [
            scalar(cond_out, TensorProto.BOOL, []),
            scalar(new_total, elem, []),
            scalar(padded, elem, [plan.chunk_size, plan.width]),
        ],
    )
    return graph, padded


def _stop(acc: ModelAccessor, value: str) -> Value:
    out = acc.op("Identity", [value], name=acc.names.fresh(STOP_GRADIENT_NODE))
    assert isinstance(out, Value)
    return out


def chunked_cross_entropy(acc: ModelAccessor, plan: ChunkPlan, name_hint: str) -> Value:
    """The loss of ``plan`` (a scalar named from ``name_hint``), chunk by chunk in a ``Loop``."""
    elem = acc.elem_type(str(plan.rows)) or TensorProto.FLOAT
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    count = _op(acc, "Slice", [_op(acc, "Shape", [plan.labels]), *_ints(acc, [0], [1], [0])])
    size = acc.constant(np.array([plan.chunk_size], np.int64), name_hint="chunk_size")
    one = acc.constant(np.array([1], np.int64), name_hint="one")
    trips = _op(acc, "Max", [_op(acc, "Div", [(count + (size - one)), size]), one])
    trips = _op(acc, "Reshape", [trips, acc.constant(np.array([], np.int64), name_hint="scalar")])
    body, _ = _body(plan, acc, str(count), elem)
    total, stacked = acc.op(
        "Loop",
        [
            str(trips),
            str(acc.constant(np.array(True), name_hint="true")),
            str(acc.constant(np.array(0, dtype), name_hint="zero_loss")),
        ],
        outputs=2,
        body=body,
        output_types=[
            helper.make_tensor_type_proto(elem, []),
            helper.make_tensor_type_proto(elem, [None, plan.chunk_size, plan.width]),
        ],
    )
    width = acc.constant(np.array([-1, plan.width], np.int64), name_hint="rows_shape")
    grad = _op(acc, "Slice", [_op(acc, "Reshape", [stacked, width]), _ints(acc, [0])[0], count])
    zero_sum = _zero_with_gradient(acc, plan.rows, grad)
    loss = _stop(acc, str(total)) + zero_sum
    if plan.empty is None:
        out = acc.op("Identity", [loss], outputs=[acc.names.fresh(name_hint)])
    else:
        nan = acc.constant(np.array(np.nan, dtype), name_hint="nan")
        out = acc.op("Where", [plan.empty, nan, loss], outputs=[acc.names.fresh(name_hint)])
    assert isinstance(out, Value)
    return out


def _zero_with_gradient(acc: ModelAccessor, rows: Value, grad: Value) -> Value:
    """``sum(rows * stop(grad)) - stop(sum(rows * grad))``: exactly 0, with gradient ``grad``."""
    stopped = _stop(acc, str(grad))
    live = _op(acc, "ReduceSum", [_op(acc, "Mul", [rows, stopped])], keepdims=0)
    frozen = _op(acc, "ReduceSum", [_op(acc, "Mul", [rows, grad])], keepdims=0)
    out: Value = live - _stop(acc, str(frozen))
    return out


def _op(acc: ModelAccessor, op_type: str, inputs: list, **attributes: Any) -> Value:
    """One node with one output."""
    out = acc.op(op_type, inputs, **attributes)
    assert isinstance(out, Value)
    return out


def _ints(acc: ModelAccessor, *arrays: list[int]) -> list[Value]:
    return [acc.constant(np.array(a, np.int64), name_hint="slice_arg") for a in arrays]
