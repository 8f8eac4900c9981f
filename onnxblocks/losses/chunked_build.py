"""``CrossEntropyLoss(chunk_size=..., head_weight=...)``: the options checked, the rows and labels
prepared for :func:`onnxblocks.losses.chunked.chunked_cross_entropy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, UnknownNameError
from onnxblocks.blocks.value import Value
from onnxblocks.losses._base import axes_op, format_shape, reduce_all
from onnxblocks.losses._class_scores import ClassLoss
from onnxblocks.losses.chunked import ChunkPlan, chunked_cross_entropy

__all__ = ["Chunking", "build_chunked", "check_chunking"]


@dataclass(frozen=True)
class Chunking:
    """The chunking options of a cross entropy: rows per chunk, and the LM head's weight."""

    chunk_size: int
    head_weight: str | None


def check_chunking(
    loss: ClassLoss, chunk_size: object, head_weight: object, label_smoothing: float = 0.0
) -> Chunking | None:
    """The options, checked; None without ``chunk_size``.

    Raises:
        TypeError: for a ``chunk_size`` that is not an int, a ``head_weight`` not a string.
        ValueError: for a ``chunk_size`` below 1, ``head_weight`` without ``chunk_size``, or
            options the chunked loss does not compute.
    """
    if head_weight is not None and not isinstance(head_weight, str):
        raise InvalidTypeError(
            "CrossEntropyLoss: head_weight must be the name of the LM head's weight "
            f"initializer, not {type(head_weight).__name__}: {head_weight!r}."
        )
    if chunk_size is None:
        if head_weight is not None:
            raise InvalidValueError(
                "CrossEntropyLoss: head_weight is used by the chunked loss only; give "
                "chunk_size too (e.g. chunk_size=64)."
            )
        return None
    if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, (int, np.integer)):
        raise InvalidTypeError(
            "CrossEntropyLoss: chunk_size must be an int (rows per chunk), not "
            f"{type(chunk_size).__name__}: {chunk_size!r}."
        )
    if chunk_size < 1:
        raise InvalidValueError(
            f"CrossEntropyLoss: chunk_size must be at least 1, got {chunk_size}."
        )
    refused = [
        what
        for what, on in (
            (f"reduction={loss.reduction!r}", loss.reduction == "none"),
            ("label_smoothing", label_smoothing > 0),
        )
        if on
    ]
    if refused:
        raise InvalidValueError(
            f"CrossEntropyLoss: chunk_size computes a mean or a sum without label smoothing, "
            f"not {' and '.join(refused)}. Leave chunk_size=None for those."
        )
    return Chunking(int(chunk_size), head_weight)


def _head_input(loss: ClassLoss, scores: str, weight: str) -> tuple[str, bool] | None:
    """The input of the head node computing ``scores`` from ``weight``, and whether the weight
    is read ``[in, out]``; None when no head node reading ``weight`` writes ``scores``.
    """
    producer = loss.accessor.producer
    node = producer(scores)
    if node is None or node.op_type not in ("MatMul", "Gemm"):
        return None
    transposes = 0
    if node.op_type == "Gemm":
        if node.attributes.get_int("transA", 0) or (len(node.inputs) > 2 and node.inputs[2]):
            return None
        transposes = node.attributes.get_int("transB", 0)
    source = _name(node.inputs[1])
    for _ in range(8):  # a weight reaches its head through a short chain of moves
        step = producer(source)
        if source == weight or step is None or step.op_type not in ("Transpose", "Identity"):
            break
        transposes += step.op_type == "Transpose"
        source = _name(step.inputs[0])
    if source != weight:
        return None
    return _name(node.inputs[0]), transposes % 2 == 0


def _name(value: Any) -> str:
    """The name of an input value (empty for an omitted one)."""
    return "" if value is None else value.name or ""


def build_chunked(
    loss: ClassLoss, chunking: Chunking, scores: str, labels_name: str, axis: int
) -> Value:
    """The chunked cross entropy of ``scores`` (logits, or hidden states with a head weight).

    Raises:
        ValueError: when the classes are not the last axis, the head weight is not 2-D or does
            not fit the scores, or the rows' last dim is not static.
        UnknownNameError: for a head weight the model does not have.
    """
    acc = loss.accessor
    shape = acc.shape_of(scores)
    if shape is None or axis != len(shape) - 1 or len(shape) < 2:
        raise InvalidValueError(
            f"{acc.where()}chunk_size needs the classes on the last axis of scores "
            f"'{scores}' of shape {format_shape(shape)} ([B, T, V] or [N, V], "
            "class_axis=-1)."
        )
    head, in_out = chunking.head_weight, False
    if head is not None:
        if not acc.has_value(head):
            raise UnknownNameError(
                f"{acc.where()}head_weight '{head}' is not a value of the model; name the "
                "LM head's weight initializer (e.g. 'lm_head.weight')."
            )
        wshape = acc.shape_of(head)
        if wshape is None or len(wshape) != 2 or not all(isinstance(d, int) for d in wshape):
            raise InvalidValueError(
                f"{acc.where()}head_weight '{head}' has shape {format_shape(wshape)}; it must "
                "be a 2-D weight of static shape ([V, H] or [H, V])."
            )
        traced = _head_input(loss, scores, head)
        if traced is not None:
            scores, in_out = traced
            shape = acc.shape_of(scores)
        elif shape[-1] == wshape[1]:
            in_out = False
        elif shape[-1] == wshape[0]:
            in_out = True
        else:
            raise InvalidValueError(
                f"{acc.where()}scores '{scores}' of shape {format_shape(shape)} are neither "
                f"hidden states of the head weight '{head}' {format_shape(wshape)} nor logits "
                "a MatMul or Gemm computes from it. Pass the hidden states the head reads."
            )
    width = shape[-1] if shape is not None else None
    if not isinstance(width, int):
        raise InvalidValueError(
            f"{acc.where()}the last dim of '{scores}' ({format_shape(shape)}) must be static "
            "for chunk_size; export the model with a static hidden size or vocabulary."
        )
    labels, _ = loss._labels(scores, labels_name, len(shape) - 1)
    if head is None:
        loss._check_weight(scores, len(shape) - 1)
    rows = acc.op(
        "Reshape", [scores, acc.constant(np.array([-1, width], np.int64), name_hint="rows")]
    )
    flat = acc.op(
        "Reshape", [labels, acc.constant(np.array([-1], np.int64), name_hint="labels_shape")]
    )
    if acc.elem_type(str(flat)) != TensorProto.INT64:
        flat = acc.op("Cast", [flat], to=TensorProto.INT64)
    assert isinstance(rows, Value) and isinstance(flat, Value)
    keep, _, safe = loss._label_mask(str(flat))
    if keep is not None and head is not None:
        where = axes_op(acc, "Squeeze", str(acc.op("NonZero", [keep])), [0])
        rows = acc.op("Gather", [rows, where], axis=0)
        safe = acc.op("Gather", [flat, where], axis=0)
        keep = None
    assert isinstance(rows, Value) and isinstance(safe, Value)
    elem = acc.elem_type(scores) or TensorProto.FLOAT
    ones = acc.op(
        "ConstantOfShape",
        [acc.op("Shape", [safe])],
        value=helper.make_tensor("one", elem, [1], [1]),
    )
    class_weight = loss._class_weight_of(safe, scores)
    weight_i = loss._label_weights(keep, class_weight, scores)
    weight_i = ones if weight_i is None else weight_i
    empty = None
    share = weight_i
    if loss.reduction == "mean":
        denominator = reduce_all(acc, "ReduceSum", str(weight_i))
        empty = acc.op("Equal", [denominator, loss._const(0.0, scores, "zero")])
        safe_denominator = acc.op("Where", [empty, loss._const(1.0, scores, "one"), denominator])
        share = acc.op("Div", [weight_i, safe_denominator])
    assert isinstance(share, Value)
    plan = ChunkPlan(
        rows=rows,
        labels=safe,
        share=share,
        empty=empty if isinstance(empty, Value) else None,
        head=head,
        head_in_out=in_out,
        chunk_size=chunking.chunk_size,
        width=width,
    )
    return chunked_cross_entropy(acc, plan, loss._name_hint)
