r"""Learning-rate schedules: pure functions of the optimizer step.

A schedule maps ``t``, the number of optimizer steps already taken (0 before
the first update), to the learning rate of update ``t + 1``. :func:`fit` sets
``session.learning_rate = schedule(session.step)`` before every optimizer step,
so a resumed run (whose checkpoint restores ``session.step``) continues the
schedule exactly. Each schedule has a ``warmup_steps`` phase (except
:class:`StepSchedule`) that ramps linearly from 0, the convention of ONNX
Runtime's ``LinearLRScheduler`` and of Hugging Face's schedules: with
``warmup_steps = W > 0`` the first update uses ``lr = 0``.

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
from abc import ABC, abstractmethod
from typing import Any

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidValueError


class Schedule(ABC):
    """A learning rate as a function of the number of optimizer steps taken.

    Args:
        base_lr: The peak learning rate (after warmup).
        warmup_steps: Steps of linear warmup from 0 to ``base_lr``.
    """

    kind: str = ""

    def __init__(self, base_lr: float, warmup_steps: int = 0) -> None:
        _hyper.learning_rate(base_lr, f"{type(self).__name__}: base_lr")
        _check_count(self, "warmup_steps", warmup_steps)
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step: int) -> float:
        """The learning rate of the update that follows ``step`` completed updates."""
        step = _hyper.step(step, f"{type(self).__name__}: step")
        if step < self.warmup_steps:
            return self.base_lr * step / self.warmup_steps
        # the same check as the session's setter: a schedule cannot hand ONNX Runtime what the
        # setter refuses
        return _hyper.learning_rate(self._after_warmup(step), f"{type(self).__name__}({step})")

    @abstractmethod
    def _after_warmup(self, step: int) -> float: ...

    def values(self, steps: int) -> list[float]:
        """The learning rates of the first ``steps`` updates."""
        return [self(t) for t in range(steps)]

    def state_dict(self) -> dict[str, Any]:
        """The schedule's settings, JSON-encodable (see :func:`schedule_from_dict`)."""
        return {"kind": self.kind, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.state_dict().items() if k != "kind")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.state_dict() == other.state_dict()

    __hash__ = None  # type: ignore[assignment]  # unhashable on purpose; typeshed types object.__hash__ as a method


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


class StepSchedule(Schedule):
    """``base_lr`` multiplied by ``gamma`` every ``step_size`` steps.

    Args:
        base_lr: Initial learning rate.
        step_size: Steps between two decays (>= 1).
        gamma: Factor applied at each decay.
    """

    kind = "step"

    def __init__(self, base_lr: float, step_size: int, gamma: float = 0.1) -> None:
        super().__init__(base_lr, 0)
        if not isinstance(step_size, int) or step_size < 1:
            raise InvalidValueError(
                f"StepSchedule: step_size must be an int >= 1, got {step_size!r}."
            )
        self.step_size = step_size
        self.gamma = _hyper.nonnegative(gamma, "StepSchedule: gamma")

    def _after_warmup(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.step_size)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        del state["warmup_steps"]
        return state


SCHEDULES: dict[str, type[Schedule]] = {
    cls.kind: cls for cls in (ConstantSchedule, LinearSchedule, CosineSchedule, StepSchedule)
}


def schedule_from_dict(state: dict[str, Any]) -> Schedule:
    """Rebuild a schedule from :meth:`Schedule.state_dict`.

    Raises:
        ValueError: for an unknown ``kind``.
    """
    settings = dict(state)
    kind = settings.pop("kind", None)
    if kind not in SCHEDULES:
        raise InvalidValueError(
            f"Unknown schedule kind {kind!r}; known kinds: {sorted(SCHEDULES)}."
        )
    return SCHEDULES[kind](**settings)


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
    raise InvalidValueError(f"Unknown schedule {kind!r}; choose one of {sorted(SCHEDULES)}.")


def _check_count(owner: object, name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidValueError(
            f"{type(owner).__name__}: {name} must be an int >= 0, got {value!r}."
        )


def _check_total(owner: object, total_steps: Any, warmup_steps: int) -> None:
    _check_count(owner, "total_steps", total_steps)
    if total_steps <= warmup_steps:
        raise InvalidValueError(
            f"{type(owner).__name__}: total_steps ({total_steps}) must be greater than "
            f"warmup_steps ({warmup_steps})."
        )
