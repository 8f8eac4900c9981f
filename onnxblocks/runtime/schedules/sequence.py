"""Schedules run one after another: torch's ``SequentialLR`` (the usual way to add a warmup)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.runtime.schedules.schedule import Schedule, _count, schedule_from_dict


class SequentialLR(Schedule):
    """``torch.optim.lr_scheduler.SequentialLR``: schedule ``i`` runs from milestone ``i - 1``,
    restarted at 0.

    The usual warmup: ``SequentialLR([LinearLR(b, 0.01, total_iters=W), CosineAnnealingLR(b, T)],
    [W])``.
    """

    kind = "SequentialLR"

    def __init__(
        self, schedulers: Sequence[Schedule | dict[str, Any]], milestones: Sequence[int]
    ) -> None:
        made = [
            schedule_from_dict(s) if isinstance(s, dict) else s for s in schedulers
        ]  # from state_dict()
        if not made or not all(isinstance(s, Schedule) for s in made):
            raise InvalidTypeError(
                "SequentialLR: schedulers must be a non-empty list of schedules."
            )
        if len(milestones) != len(made) - 1:
            raise InvalidValueError(
                f"SequentialLR: {len(made)} schedulers need {len(made) - 1} milestones, got "
                f"{len(milestones)}."
            )
        super().__init__(made[0].base_lr, 0)
        self.schedulers: list[Schedule] = made
        self.milestones = [_count("SequentialLR", "milestones[]", m) for m in milestones]
        if self.milestones != sorted(self.milestones):
            raise InvalidValueError(
                f"SequentialLR: milestones must increase, got {list(milestones)}."
            )

    def _after_warmup(self, step: int) -> float:
        index = bisect_right(self.milestones, step)
        start = self.milestones[index - 1] if index else 0
        return self.schedulers[index](step - start)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "schedulers": [s.state_dict() for s in self.schedulers],
            "milestones": list(self.milestones),
        }
