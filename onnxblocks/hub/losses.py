"""The loss of each hub task, as Hugging Face's ``*For*`` models compute it from ``labels``.

``causal-lm``: the token cross-entropy of ``logits[:, :-1]`` against ``labels[:, 1:]`` (the
labels are the input ids, shifted inside the graph as transformers shifts them), classes last,
labels of -100 ignored. ``token-classification`` and ``masked-lm``: the same without the shift.
``sequence-classification``: cross-entropy of ``logits [batch, classes]`` and ``labels [batch]``.
"""

from __future__ import annotations

from onnx import TensorProto

from onnxblocks.blocks import Block, Value
from onnxblocks.losses import CrossEntropyLoss

#: transformers' label that adds nothing to a loss (padding, prompt tokens).
IGNORE_INDEX = -100
#: The labels input every hub loss creates.
LABELS = "labels"
_INT64_MAX = 2**63 - 1


class ShiftedCrossEntropyLoss(Block):
    """Next-token cross-entropy: ``logits[:, :-1]`` scored against ``labels[:, 1:]``.

    Args:
        ignore_index: The label that adds nothing (default -100, as transformers).
        chunk_size: Tokens per chunk of the log-softmax (:class:`CrossEntropyLoss`).
    """

    _name_hint = "causal_lm_loss"

    def __init__(self, ignore_index: int = IGNORE_INDEX, chunk_size: int | None = None) -> None:
        super().__init__()
        self._inner = CrossEntropyLoss(
            ignore_index=ignore_index, class_axis=-1, chunk_size=chunk_size
        )

    def build(self, logits_name: str, labels_name: str = LABELS) -> Value:
        acc = self.accessor
        acc.require(logits_name, role="logits")
        shape = acc.shape_of(logits_name)
        if not acc.has_value(labels_name):
            dims = list(shape[:2]) if shape is not None and len(shape) == 3 else [None, None]
            acc.add_input(labels_name, TensorProto.INT64, dims)
        one = acc.constant([1], TensorProto.INT64, "shift_one")
        zero = acc.constant([0], TensorProto.INT64, "shift_zero")
        last = acc.constant([-1], TensorProto.INT64, "shift_last")
        end = acc.constant([_INT64_MAX], TensorProto.INT64, "shift_end")
        scores = acc.op("Slice", [logits_name, zero, last, one])
        targets = acc.op("Slice", [labels_name, one, end, one])
        out: Value = self._inner(str(scores), str(targets))
        return out


def task_loss(task: str, *, ignore_index: int = IGNORE_INDEX, chunk_size: int | None = None):
    """The loss block of ``task`` (one of :data:`onnxblocks.hub.record.TASKS`)."""
    if task == "causal-lm":
        return ShiftedCrossEntropyLoss(ignore_index, chunk_size)
    if task == "sequence-classification":
        return CrossEntropyLoss(ignore_index=ignore_index)
    return CrossEntropyLoss(ignore_index=ignore_index, class_axis=-1, chunk_size=chunk_size)
