r"""Schedules with a warmup from 0, kept for one release beside the torch-named family.

``ConstantSchedule``, ``LinearSchedule``, ``CosineSchedule`` and ``StepSchedule`` ramp linearly
from 0 over ``warmup_steps`` (the convention of ONNX Runtime's ``LinearLRScheduler`` and of Hugging
Face's schedules: with ``warmup_steps = W > 0`` the first update uses ``lr = 0``). The torch
names (:mod:`onnxblocks.runtime.schedules.decay`) are the one family of the public API; these serve
code and checkpoints that name them (kinds ``constant``, ``linear``, ``cosine``, ``step``), and
:func:`make_schedule` builds them by the CLI's names.

Formulas (``b`` = ``base_lr``, ``W`` = ``warmup_steps``, ``T`` = ``total_steps``):

============================ ===============================================================
:class:`ConstantSchedule`    ``b * t / W`` for ``t < W``, else ``b``
:class:`LinearSchedule`      ``b * t / W`` for ``t < W``, else
                             ``e + (b - e) * max(0, (T - t) / (T - W))`` (``e`` = ``end_lr``)
:class:`CosineSchedule`      ``b * t / W`` for ``t < W``, else
                             ``m + (b - m) * (1 + cos(pi * p)) / 2`` with
                             ``p = min(1, (t - W) / (T - W))`` (``m`` = ``min_lr``)
:class:`StepSchedule`        ``b * gamma ** (t // step_size)``
============================ ===============================================================

``LinearSchedule(b, T, W)`` equals ONNX Runtime's ``LinearLRScheduler``;
``CosineSchedule(b, T, min_lr=m)`` equals ``torch.optim.lr_scheduler.CosineAnnealingLR(T_max=T,
eta_min=m)``; ``StepSchedule`` equals ``torch.optim.lr_scheduler.StepLR`` (up to float rounding
of torch's step-by-step products).
"""

from __future__ import annotations

import math

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidValueError
from onnxblocks.runtime.schedules.decay import StepLR
from onnxblocks.runtime.schedules.schedule import Schedule, _check_total


class ConstantSchedule(Schedule):
    """``base_lr`` after an optional linear warmup."""

    kind = "constant"

    def _after_warmup(self, step: int) -> float:
        return self.base_lr


class LinearSchedule(Schedule):
    """Linear warmup, then linear decay to ``end_lr`` at ``total_steps`` (held afterwards).

    Args:
        base_lr: Peak learning rate.
        total_steps: Step at which the decay reaches ``end_lr``.
        warmup_steps: Warmup steps (< ``total_steps``).
        end_lr: Final learning rate.
    """

    kind = "linear"

    def __init__(
        self, base_lr: float, total_steps: int, warmup_steps: int = 0, end_lr: float = 0.0
    ) -> None:
        super().__init__(base_lr, warmup_steps)
        _check_total(self, total_steps, warmup_steps)
        self.total_steps = int(total_steps)
        self.end_lr = _hyper.learning_rate(end_lr, "LinearSchedule: end_lr")

    def _after_warmup(self, step: int) -> float:
        remaining = max(0.0, (self.total_steps - step) / (self.total_steps - self.warmup_steps))
        return self.end_lr + (self.base_lr - self.end_lr) * remaining


class CosineSchedule(Schedule):
    """Linear warmup, then half a cosine from ``base_lr`` down to ``min_lr`` at ``total_steps``.

    Args:
        base_lr: Peak learning rate.
        total_steps: Step at which the cosine reaches ``min_lr`` (held afterwards).
        warmup_steps: Warmup steps (< ``total_steps``).
        min_lr: Final learning rate.
    """

    kind = "cosine"

    def __init__(
        self, base_lr: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0
    ) -> None:
        super().__init__(base_lr, warmup_steps)
        _check_total(self, total_steps, warmup_steps)
        self.total_steps = int(total_steps)
        self.min_lr = _hyper.learning_rate(min_lr, "CosineSchedule: min_lr")

    def _after_warmup(self, step: int) -> float:
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return (
            self.min_lr + (self.base_lr - self.min_lr) * (1.0 + math.cos(math.pi * progress)) / 2.0
        )


class StepSchedule(StepLR):
    """``base_lr`` multiplied by ``gamma`` every ``step_size`` steps: :class:`StepLR` under the
    name a ``state_dict`` of kind ``"step"`` carries.

    Args:
        base_lr: Initial learning rate.
        step_size: Steps between two decays (>= 1).
        gamma: Factor applied at each decay.
    """

    kind = "step"


_CLI_KINDS = ("constant", "linear", "cosine", "step")


def make_schedule(
    kind: str,
    base_lr: float,
    *,
    total_steps: int | None = None,
    warmup_steps: int = 0,
    step_size: int | None = None,
    gamma: float = 0.1,
    min_lr: float = 0.0,
) -> Schedule:
    """Build a schedule by name (``constant``, ``linear``, ``cosine``, ``step``), as the CLI does.

    Raises:
        ValueError: for an unknown name or a missing setting.
    """
    if kind == "constant":
        return ConstantSchedule(base_lr, warmup_steps)
    if kind in ("linear", "cosine"):
        if total_steps is None:
            raise InvalidValueError(f"The {kind} schedule needs total_steps.")
        if kind == "linear":
            return LinearSchedule(base_lr, total_steps, warmup_steps)
        return CosineSchedule(base_lr, total_steps, warmup_steps, min_lr)
    if kind == "step":
        if step_size is None:
            raise InvalidValueError("The step schedule needs step_size.")
        return StepSchedule(base_lr, step_size, gamma)
    raise InvalidValueError(f"Unknown schedule {kind!r}; choose one of {sorted(_CLI_KINDS)}.")
