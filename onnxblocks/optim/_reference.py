"""Drop-in counterparts of ``onnxruntime.training.onnxblock.optim`` with the same defaults and
signatures.

The reference's optimizers follow Hugging Face's AdamW (``adam_mode=1``) with
``eps=1e-6`` and ``weight_decay=0.0``; onnxblocks' own :class:`~onnxblocks.optim.AdamW`
follows torch instead. Use these classes (re-exported by ``onnxblocks.compat``)
where existing code relies on the reference's numbers.
"""

from __future__ import annotations

import warnings
from typing import Any

from onnxblocks.blocks.value import Value
from onnxblocks.optim.adamw import AdamW, AdamWUpdate
from onnxblocks.optim.clip import ClipGradNorm
from onnxblocks.optim.sgd import SGD, SGDUpdate

__all__ = ["AdamWOptimizer", "ClipGradNorm", "ReferenceAdamW", "ReferenceSGD", "SGDOptimizer"]


class ReferenceAdamW(AdamW):
    """AdamW with the reference's defaults: ``eps=1e-6``, ``weight_decay=0.0``, Hugging Face mode.

    Same signature as ``onnxruntime.training.onnxblock.optim.AdamW``.
    """

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        clip_grad: ClipGradNorm | float | None = None,
    ) -> None:
        super().__init__(bias_correction, betas, eps, weight_decay, clip_grad, mode="hf")


#: The reference's SGD has the same defaults as onnxblocks' own.
ReferenceSGD = SGD


class AdamWOptimizer(AdamWUpdate):
    """The reference's low-level AdamW block: one ``AdamWOptimizer`` node in Hugging Face mode.

    Same constructor defaults and ``build`` signature as
    ``onnxruntime.training.onnxblock.optim.AdamWOptimizer``.
    """

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(bias_correction, betas, eps, weight_decay, mode="hf")

    def build(
        self,
        learning_rate_name: str,
        step_name: str,
        parameter_sequence_name: str,
        gradient_sequence_name: str,
        first_order_moment_sequence_name: str,
        second_order_moment_sequence_name: str,
    ) -> Value:
        """Add the update node and return its updated flag."""
        return super().build(
            learning_rate_name,
            step_name,
            parameter_sequence_name,
            gradient_sequence_name,
            first_order_moment_sequence_name,
            second_order_moment_sequence_name,
        )


class SGDOptimizer(SGDUpdate):
    """The reference's low-level SGD block, with its ``build`` signature.

    As in the reference, the arguments are passed to ``SGDOptimizerV2`` in the
    order given: ``(learning_rate, params, gradients)`` positionally, although
    the reference named the second one ``gradients_name`` and the third
    ``params_name``. Calling it with those keywords therefore feeds the
    gradients into the parameter slot, exactly as the reference did; a warning
    says so. Prefer :class:`onnxblocks.optim.sgd.SGDUpdate` in new code.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "gradients_name" in kwargs or "params_name" in kwargs:
            warnings.warn(
                "SGDOptimizer keeps the reference's argument order: the 2nd argument "
                "('gradients_name') goes into "
                "the parameter slot and the 3rd ('params_name') into the gradient slot. Pass "
                "them positionally as "
                "(learning_rate, params, gradients), or use onnxblocks.optim.sgd.SGDUpdate.",
                UserWarning,
                stacklevel=2,
            )
        return super().__call__(*args, **kwargs)

    def build(self, learning_rate_name: str, gradients_name: str, params_name: str) -> Value:
        """Add the update node and return its updated flag."""
        return super().build(learning_rate_name, gradients_name, params_name)
