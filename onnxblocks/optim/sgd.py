"""SGD: the optimizer model and the single-node update block (``w -= lr * g``).

Plain SGD is ONNX Runtime's ``SGDOptimizerV2``; with momentum, dampening,
Nesterov, weight decay, ``maximize`` or parameter groups it is written in
standard ops (:class:`~onnxblocks.optim.standard.StandardOptimizer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value
from onnxblocks.optim import contrib_ops as contrib
from onnxblocks.optim.base import Optimizer, spec_type
from onnxblocks.optim.clip import ClipGradNorm
from onnxblocks.optim.standard import StandardOptimizer

if TYPE_CHECKING:
    from onnxblocks.portable.optimizer_spec import OptimizerSpec


class SGDUpdate(Block):
    """One ``SGDOptimizerV2`` node: ``w -= lr * g`` for every parameter of a sequence, in place."""

    def build(self, learning_rate: str, params: str, gradients: str) -> Value:
        """Add the update node and return its bool ``[1]`` updated flag."""
        acc = self.accessor
        raw = contrib.SGD_OPTIMIZER_V2.emit(
            [learning_rate, params, gradients], outputs=[acc.names.fresh("sgd.update_completed")]
        )
        # the op's flag has no consistent shape in ONNX Runtime (inferred [], returned [1]): a
        # Reshape states it
        shape = acc.constant(np.array([1], dtype=np.int64), name_hint="sgd.flag_shape")
        out = acc.op("Reshape", [raw, shape], outputs=[acc.names.fresh("sgd.updated_flag")])
        assert isinstance(out, Value)
        return out


class SGD(Optimizer):
    """``torch.optim.SGD``: plain, or with momentum, dampening, Nesterov, weight decay and parameter
    groups.

    Plain SGD (the defaults, no groups) is ONNX Runtime's ``SGDOptimizerV2``: the
    model declares every input ONNX Runtime's training API requires (``learning_rate``,
    ``step``, ``params``, ``gradients``, ``first_order_moments``) although SGD reads
    only three of them; :attr:`optimizer_spec` has ``form="onnxruntime"``. Any other option writes
    the update in standard ops (:class:`~onnxblocks.optim.standard.StandardOptimizer`,
    ``form="standard"``), because the kernel computes ``w -= lr * g`` alone, with one learning rate
    for every parameter; the training build's runtime then drives that model itself
    (:mod:`onnxblocks.runtime.optimizer_driver`).

    Args:
        clip_grad: Clip the gradients' global L2 norm first: a :class:`ClipGradNorm`, a max norm,
            or None.
        lr: The default group's learning rate (the session's learning rate replaces it at run time;
            groups' absolute ``lr`` keep their ratio to it).
        momentum, dampening, weight_decay, nesterov, maximize: As ``torch.optim.SGD``'s.
        param_groups: Parameter groups (see :mod:`onnxblocks.optim.standard`).

    Raises:
        ValueError: for hyperparameters out of torch's ranges.
    """

    def __init__(
        self,
        clip_grad: ClipGradNorm | float | None = None,
        *,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
        param_groups: Sequence[Mapping[str, Any]] | None = None,
        exact: bool = True,
    ) -> None:
        super().__init__(clip_grad)
        self.step_block = SGDUpdate()
        hyper = {
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
        }
        standard = StandardOptimizer(
            "sgd", hyper, lr, param_groups, clip_grad, owner="SGD", exact=exact
        )
        plain = not param_groups and all(not v for v in standard.hyper.values())
        self.standard = None if plain else standard

    def spec(self, trainable: Sequence[Any], elem_type: int) -> OptimizerSpec:
        """ONNX Runtime's ``SGDOptimizerV2``, or the standard-op SGD (see the class docs)."""
        if self.standard is not None:
            return self.standard.spec(trainable, elem_type)
        names = [p.name for p in trainable]
        return spec_type().kernel("sgd", {}, self.max_norm, elem_type, names)

    def update(
        self,
        learning_rate: Value,
        step: Value,
        params: Value,
        gradients: Value,
        states: list[Value],
    ) -> Value:
        """Add the SGD update and return its flag."""
        return self.step_block(learning_rate, params, gradients)

    def __repr__(self) -> str:
        if self.standard is not None:
            return repr(self.standard)
        return f"SGD(clip_grad={self.clip_grad!r})"
