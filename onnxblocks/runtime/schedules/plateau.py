"""A learning rate that follows an evaluation metric: torch's ``ReduceLROnPlateau``.

It is not a function of the step, so it is not a :class:`~onnxblocks.runtime.schedules.Schedule`:
:func:`~onnxblocks.runtime.fit.fit` steps it after each evaluation with an epoch metric.
"""

from __future__ import annotations

import math
from typing import Any

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.runtime.schedules.schedule import _count


class ReduceLROnPlateau:
    """``torch.optim.lr_scheduler.ReduceLROnPlateau``: multiply the rate by ``factor`` when a metric
    stops improving.

    Not a function of the step: call :meth:`step` with each evaluation's metric; :attr:`lr`
    is the rate to train with. :func:`~onnxblocks.runtime.fit.fit` does this after each evaluation.

    Args:
        base_lr: The starting learning rate.
        mode, factor, patience, threshold, threshold_mode, cooldown, min_lr, eps: As torch's.
        monitor: The metric of :func:`~onnxblocks.runtime.fit.fit`'s epoch logs it follows there.
    """

    kind = "ReduceLROnPlateau"

    def __init__(
        self,
        base_lr: float,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float = 0.0,
        eps: float = 1e-8,
        monitor: str = "eval_loss",
    ) -> None:
        if not isinstance(monitor, str):
            raise InvalidTypeError(
                f"ReduceLROnPlateau: monitor must be a metric name, not {monitor!r:.60}."
            )
        self.monitor = monitor
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise InvalidValueError(
                "ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode 'rel' or "
                f"'abs', got {mode!r}, "
                f"{threshold_mode!r}."
            )
        if not 0 <= _hyper.nonnegative(factor, "ReduceLROnPlateau: factor") < 1:
            raise InvalidValueError(f"ReduceLROnPlateau: factor must be < 1, got {factor!r}.")
        self.lr = _hyper.learning_rate(base_lr, "ReduceLROnPlateau: base_lr")
        self.mode, self.threshold_mode, self.factor = mode, threshold_mode, float(factor)
        self.patience = _count("ReduceLROnPlateau", "patience", patience, 0)
        self.cooldown = _count("ReduceLROnPlateau", "cooldown", cooldown, 0)
        self.threshold = _hyper.nonnegative(threshold, "ReduceLROnPlateau: threshold")
        self.min_lr = _hyper.learning_rate(min_lr, "ReduceLROnPlateau: min_lr")
        self.eps = _hyper.nonnegative(eps, "ReduceLROnPlateau: eps")
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = 0

    def _is_better(self, current: float) -> bool:
        if self.mode == "min":
            bound = (
                self.best * (1 - self.threshold)
                if self.threshold_mode == "rel"
                else self.best - self.threshold
            )
            return current < bound
        bound = (
            self.best * (1 + self.threshold)
            if self.threshold_mode == "rel"
            else self.best + self.threshold
        )
        return current > bound

    def step(self, metric: float) -> float:
        """Record one evaluation's metric; return the learning rate to train with from now on."""
        current = float(metric)
        if self._is_better(current):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            new = max(self.lr * self.factor, self.min_lr)
            if self.lr - new > self.eps:
                self.lr = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        return self.lr

    def state_dict(self) -> dict[str, Any]:
        """Its settings and state (JSON-encodable), recorded in fit's checkpoints."""
        return {"kind": self.kind, **vars(self)}

    def __repr__(self) -> str:
        return (
            f"ReduceLROnPlateau(lr={self.lr!r}, mode={self.mode!r}, factor={self.factor!r}, "
            f"patience={self.patience})"
        )
