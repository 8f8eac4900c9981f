"""SGD: the optimizer model and the single-node update block (``w -= lr * g``)."""

from __future__ import annotations

import numpy as np

from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value
from onnxblocks.optim import contrib
from onnxblocks.optim.base import Optimizer
from onnxblocks.optim.clip import ClipGradNorm


class SGDUpdate(Block):
    """One ``SGDOptimizerV2`` node: ``w -= lr * g`` for every parameter of a sequence, in place."""

    def build(self, learning_rate: str, params: str, gradients: str) -> Value:
        """Add the update node and return its bool ``[1]`` updated flag."""
        acc = self.accessor
        raw = contrib.SGD_OPTIMIZER_V2.emit(
            [learning_rate, params, gradients], outputs=[acc.names.fresh("sgd.update_completed")]
        )
        # the op's flag has no consistent shape in ONNX Runtime (inferred [], returned [1]): a Reshape states it
        shape = acc.constant(np.array([1], dtype=np.int64), name_hint="sgd.flag_shape")
        out = acc.op("Reshape", [raw, shape], outputs=[acc.names.fresh("sgd.updated_flag")])
        assert isinstance(out, Value)
        return out


class SGD(Optimizer):
    """Plain SGD (no momentum), as ``torch.optim.SGD(params, lr)`` does it.

    The model declares every input ONNX Runtime's training API requires
    (``learning_rate``, ``step``, ``params``, ``gradients``, ``first_order_moments``)
    although SGD reads only three of them.

    Args:
        clip_grad: Clip the gradients' global L2 norm first: a :class:`ClipGradNorm`, a max norm, or None.
    """

    def __init__(self, clip_grad: ClipGradNorm | float | None = None) -> None:
        super().__init__(clip_grad)
        self.step_block = SGDUpdate()

    def update(self, learning_rate: Value, step: Value, params: Value, gradients: Value, states: list[Value]) -> Value:
        """Add the SGD update and return its flag."""
        return self.step_block(learning_rate, params, gradients)

    def __repr__(self) -> str:
        return f"SGD(clip_grad={self.clip_grad!r})"
