"""A learning-rate schedule: a pure function of the optimizer step, and its registry by kind.

A schedule maps ``t``, the number of optimizer steps already taken (0 before the first update), to
the learning rate of update ``t + 1``. :func:`~onnxblocks.runtime.fit.fit` sets
``session.learning_rate = schedule(session.step)`` before every optimizer step, so a resumed run
(whose checkpoint restores ``session.step``) continues the schedule exactly. A schedule's
:meth:`~Schedule.state_dict` names its ``kind``; :func:`schedule_from_dict` rebuilds it from that,
which is how fit's checkpoints carry a schedule across a resume.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidValueError

#: Every schedule class by its ``kind``, filled as the classes are defined.
SCHEDULES: dict[str, type[Schedule]] = {}


class Schedule(ABC):
    """A learning rate as a function of the number of optimizer steps taken.

    Args:
        base_lr: The peak learning rate (after warmup).
        warmup_steps: Steps of linear warmup from 0 to ``base_lr``.
    """

    #: The name :meth:`state_dict` records and :func:`schedule_from_dict` reads back; a subclass
    #: that sets one is registered under it.
    kind: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):
            SCHEDULES[cls.kind] = cls

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


def _count(owner: str, name: str, value: Any, least: int = 1) -> int:
    return _hyper.count(value, f"{owner}: {name}", least)


def _check_count(owner: object, name: str, value: Any) -> None:
    _hyper.count(value, f"{type(owner).__name__}: {name}")


def _check_total(owner: object, total_steps: Any, warmup_steps: int) -> None:
    _check_count(owner, "total_steps", total_steps)
    if total_steps <= warmup_steps:
        raise InvalidValueError(
            f"{type(owner).__name__}: total_steps ({total_steps}) must be greater than "
            f"warmup_steps ({warmup_steps})."
        )
