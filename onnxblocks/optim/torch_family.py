"""``torch.optim``'s Adam, Adagrad and RMSprop, and Lamb, in standard ops (with parameter groups,
see :mod:`onnxblocks.optim.standard`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from onnxblocks.optim.clip import ClipGradNorm
from onnxblocks.optim.standard import StandardOptimizer


class Adam(StandardOptimizer):
    """``torch.optim.Adam``: L2 weight decay added to the gradient, optional amsgrad, in standard
    ops.

    Args:
        lr: The default group's learning rate (the session's learning rate replaces it at run time).
        betas, eps, weight_decay, amsgrad, maximize: As ``torch.optim.Adam``'s.
        param_groups: Parameter groups (see :mod:`onnxblocks.optim.standard`).
        clip_grad: Clip the gradients' global L2 norm first.
        exact: Torch's rounding (default) or float32 ops (see :class:`StandardOptimizer`).
    """

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        param_groups: Sequence[Mapping[str, Any]] | None = None,
        clip_grad: ClipGradNorm | float | None = None,
        exact: bool = True,
    ) -> None:
        hyper = {
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
        }
        super().__init__("adam", hyper, lr, param_groups, clip_grad, exact=exact)


class Lamb(StandardOptimizer):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning", Algorithm 2) in
    standard ops.

    Per parameter tensor, with Adam's moments ``m``, ``v`` (bias-corrected unless
    ``bias_correction=False``, which is ONNX Runtime's ``LambOptimizer`` default)::

        u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w
        w = w - lr * (||w|| / ||u||) * u          # the trust ratio is 1 when either norm is 0

    (the scaling function phi of the paper is the identity; no ratio clamping). torch has no Lamb.

    Args:
        lr, betas, eps, weight_decay: As above (``eps`` 1e-6 as ONNX Runtime's ``LambOptimizer``).
        bias_correction: Divide the moments by ``1 - beta**t``.
        maximize: Ascend instead.
        param_groups: Parameter groups (see :mod:`onnxblocks.optim.standard`).
        clip_grad: Clip the gradients' global L2 norm first.
        exact: Torch's rounding (default) or float32 ops (see :class:`StandardOptimizer`).
    """

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        *,
        maximize: bool = False,
        param_groups: Sequence[Mapping[str, Any]] | None = None,
        clip_grad: ClipGradNorm | float | None = None,
        exact: bool = True,
    ) -> None:
        hyper = {
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
            "maximize": maximize,
        }
        super().__init__("lamb", hyper, lr, param_groups, clip_grad, exact=exact)


class Adagrad(StandardOptimizer):
    """``torch.optim.Adagrad`` in standard ops (same arguments and defaults)."""

    def __init__(
        self,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
        param_groups: Sequence[Mapping[str, Any]] | None = None,
        clip_grad: ClipGradNorm | float | None = None,
        exact: bool = True,
    ) -> None:
        hyper = {
            "lr_decay": lr_decay,
            "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value,
            "eps": eps,
            "maximize": maximize,
        }
        super().__init__("adagrad", hyper, lr, param_groups, clip_grad, exact=exact)


class RMSprop(StandardOptimizer):
    """``torch.optim.RMSprop`` in standard ops (same arguments and defaults)."""

    def __init__(
        self,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        *,
        maximize: bool = False,
        param_groups: Sequence[Mapping[str, Any]] | None = None,
        clip_grad: ClipGradNorm | float | None = None,
        exact: bool = True,
    ) -> None:
        hyper = {
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": centered,
            "maximize": maximize,
        }
        super().__init__("rmsprop", hyper, lr, param_groups, clip_grad, exact=exact)


__all__ = ["Adagrad", "Adam", "Lamb", "RMSprop"]
