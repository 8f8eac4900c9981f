"""AdamW: the optimizer model and the single-node update block.

``mode="torch"`` (the default) matches ``torch.optim.AdamW``; per step ``t``,
with gradient ``g``::

    w  = w - lr * weight_decay * w                      # decoupled decay, first
    m1 = beta1 * m1 + (1 - beta1) * g
    m2 = beta2 * m2 + (1 - beta2) * g**2
    w  = w - lr / (1 - beta1**t) * m1 / (sqrt(m2) / sqrt(1 - beta2**t) + eps)

``mode="hf"`` matches Hugging Face's (older ``transformers``) AdamW, which
puts ``eps`` outside the bias correction and decays after the update::

    m1, m2 as above
    step_size = lr * sqrt(1 - beta2**t) / (1 - beta1**t)   # lr without bias_correction
    w  = w - step_size * m1 / (sqrt(m2) + eps)
    w  = w - lr * weight_decay * w                      # decay, last

Both are ONNX Runtime's ``AdamWOptimizer`` op (``adam_mode`` 0 and 1). torch's options that op
lacks (``amsgrad``, ``maximize``, parameter groups) make :class:`AdamW` write torch's AdamW in
standard ops instead; its class docs say which form the artifacts get and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidValueError
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value
from onnxblocks.optim import contrib_ops as contrib
from onnxblocks.optim.base import FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS, Optimizer, spec_type
from onnxblocks.optim.clip import ClipGradNorm
from onnxblocks.optim.standard import StandardOptimizer

if TYPE_CHECKING:
    from onnxblocks.portable.optimizer_spec import OptimizerSpec

#: ``mode`` → the op's ``adam_mode`` attribute.
ADAM_MODES = {"torch": 0, "hf": 1}


def _check_hyperparameters(betas: Any, eps: float, weight_decay: float) -> tuple[float, float]:
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise InvalidValueError(f"AdamW betas must be a pair (beta1, beta2), got {betas!r}.")
    beta1, beta2 = (_hyper.beta(b, f"AdamW betas[{i}]") for i, b in enumerate(betas))
    _hyper.eps(eps, "AdamW eps")
    _hyper.weight_decay(weight_decay, "AdamW weight_decay")
    return beta1, beta2


class AdamWUpdate(Block):
    """One ``AdamWOptimizer`` node: update parameter and moment sequences in place.

    Args:
        bias_correction: Divide the moments by ``1 - beta**t``. Must be True in torch mode.
        betas: ``(beta1, beta2)``, the moments' decay rates.
        eps: Added to the denominator for numerical stability.
        weight_decay: Decoupled weight decay coefficient.
        mode: ``"torch"`` (torch.optim.AdamW) or ``"hf"`` (Hugging Face AdamW); see the module docs.

    Raises:
        ValueError: for an unknown mode, out-of-range hyperparameters, or
            ``bias_correction=False`` in torch mode (ONNX Runtime's kernel refuses it).
    """

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        mode: str = "torch",
    ) -> None:
        super().__init__()
        if mode not in ADAM_MODES:
            raise InvalidValueError(
                f"AdamW mode must be one of {sorted(ADAM_MODES)}, got {mode!r}."
            )
        if mode == "torch" and not bias_correction:
            raise InvalidValueError(
                "AdamW(mode='torch') always corrects the moments' bias, as torch.optim.AdamW "
                "does; ONNX Runtime's "
                "kernel refuses bias_correction=False in this mode. Use mode='hf' for an AdamW "
                "without bias "
                "correction."
            )
        self.betas = _check_hyperparameters(betas, eps, weight_decay)
        self.bias_correction = bool(bias_correction)
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.mode = mode

    def attributes(self) -> dict[str, Any]:
        """The ``AdamWOptimizer`` attributes this block writes."""
        return {
            "alpha": self.betas[0],
            "beta": self.betas[1],
            "epsilon": self.eps,
            "weight_decay": self.weight_decay,
            "correct_bias": int(self.bias_correction),
            "adam_mode": ADAM_MODES[self.mode],
        }

    def build(
        self,
        learning_rate: str,
        step: str,
        params: str,
        gradients: str,
        first_order_moments: str,
        second_order_moments: str,
    ) -> Value:
        """Add the update node and return its bool ``[1]`` updated flag."""
        acc = self.accessor
        inputs = [learning_rate, step, params, gradients, first_order_moments, second_order_moments]
        flag = acc.names.fresh("adamw.updated_flag")
        out = contrib.ADAMW_OPTIMIZER.emit(inputs, outputs=[flag], **self.attributes())
        assert isinstance(out, Value)
        return out


class AdamW(Optimizer):
    """The AdamW optimizer model for ONNX Runtime's training API.

    Defaults follow ``torch.optim.AdamW``. Example::

        with onnxblocks.empty_base():
            optimizer = onnxblocks.optim.AdamW(weight_decay=0.01)
            optimizer((trainable_params, frozen_params))
        optimizer_model = optimizer.to_model_proto()

    Which form the artifacts get, and why:

    * Without ``amsgrad``, ``maximize`` or ``param_groups``, the optimizer model is one
      ``AdamWOptimizer`` node (after the clipping node, if any), which ONNX Runtime's ``Optimizer``
      runs on the training build; :attr:`optimizer_spec` has ``form="onnxruntime"`` and the
      kernel's float32 arithmetic (``exact=False``; the ``exact`` argument does not apply), and
      portable artifacts write that kernel's arithmetic in standard ops.
    * With any of them, the model is torch's AdamW in standard ops (:attr:`standard`, a
      :class:`~onnxblocks.optim.standard.StandardOptimizer`), because the kernel has no amsgrad or
      maximize and applies one set of attributes to every parameter, so it cannot express them.
      :attr:`optimizer_spec` has ``form="standard"`` and torch's rounding (``exact``); the model
      carries its spec as metadata, and on the training build the runtime drives it itself
      (:mod:`onnxblocks.runtime.optimizer_driver`) rather than ONNX Runtime's ``Optimizer``. Its
      moments take the checkpoint's ``momentum0`` and ``momentum1`` slots as the kernel's do
      (amsgrad adds ``momentum2``); its numbers follow torch's rounding rather than the kernel's,
      and its cost per step differs (docs/optim.md measures both). ``mode="hf"`` has no such form
      and raises.

    Args:
        bias_correction: Correct the moments' bias (torch mode always does).
        betas: ``(beta1, beta2)``.
        eps: Denominator term for numerical stability.
        weight_decay: Decoupled weight decay coefficient.
        clip_grad: Clip the gradients' global L2 norm first: a :class:`ClipGradNorm`, a max norm,
            or None.
        mode: ``"torch"`` (``adam_mode=0``, torch.optim.AdamW) or ``"hf"`` (``adam_mode=1``,
            Hugging Face AdamW, which is what ``onnxruntime.training.onnxblock.optim.AdamW`` emits).
        lr: The default group's learning rate, to which groups' absolute ``lr`` are relative (the
            session's learning rate replaces it at run time).
        amsgrad, maximize: As ``torch.optim.AdamW``'s; either selects the standard-op form.
        param_groups: Parameter groups (see :mod:`onnxblocks.optim.standard`); they select the
            standard-op form.
        exact: In the standard-op form, round as torch's CPU kernels do; False writes float32 ops.

    Raises:
        ValueError: for bad hyperparameters, see :class:`AdamWUpdate`, and for ``amsgrad``,
            ``maximize`` or ``param_groups`` with ``mode="hf"``.
    """

    state_inputs = (FIRST_ORDER_MOMENTS, SECOND_ORDER_MOMENTS)

    def __init__(
        self,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        clip_grad: ClipGradNorm | float | None = None,
        mode: str = "torch",
        *,
        lr: float = 1e-3,
        amsgrad: bool = False,
        maximize: bool = False,
        param_groups: Sequence[Mapping[str, Any]] | None = None,
        exact: bool = True,
    ) -> None:
        super().__init__(clip_grad)
        self.step_block = AdamWUpdate(bias_correction, betas, eps, weight_decay, mode)
        hyper = {
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
        }
        standard = StandardOptimizer(
            "adamw", hyper, lr, param_groups, clip_grad, owner="AdamW", exact=exact
        )
        self.standard = (
            standard if (amsgrad is not False or maximize is not False or param_groups) else None
        )
        if self.standard is not None and mode != "torch":
            raise InvalidValueError(
                "AdamW amsgrad, maximize and param_groups follow torch.optim.AdamW: use "
                "mode='torch' with them."
            )

    def spec(self, trainable: Sequence[Any], elem_type: int) -> OptimizerSpec:
        """The spec of the form this block builds (see the class docs): ONNX Runtime's
        ``AdamWOptimizer`` with this block's attributes (``form="onnxruntime"``), or, with
        amsgrad, maximize or groups, torch's AdamW in standard ops (``form="standard"``).
        """
        if self.standard is not None:
            return self.standard.spec(trainable, elem_type)
        names = [p.name for p in trainable]
        attributes = self.step_block.attributes()
        return spec_type().kernel("adamw", attributes, self.max_norm, elem_type, names)

    def update(
        self,
        learning_rate: Value,
        step: Value,
        params: Value,
        gradients: Value,
        states: list[Value],
    ) -> Value:
        """Add the AdamW update and return its flag."""
        return self.step_block(learning_rate, step, params, gradients, states[0], states[1])

    def __repr__(self) -> str:
        s = self.step_block
        if self.standard is not None:
            return repr(self.standard)
        return (
            f"AdamW(bias_correction={s.bias_correction}, betas={s.betas}, eps={s.eps}, "
            f"weight_decay={s.weight_decay}, clip_grad={self.clip_grad!r}, mode={s.mode!r})"
        )
