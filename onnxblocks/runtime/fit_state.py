"""The state of a :func:`~onnxblocks.runtime.fit.fit` run: what it records and what its
callbacks see.

:class:`History` is what ``fit`` returns; :class:`FitRun` is handed to every callback
hook (the session, the history, the data, the epoch, the schedule). Both live apart from
the loop so that callbacks (:mod:`onnxblocks.runtime.callbacks`) can name them without
importing the loop that calls them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxblocks._core.errors import UnknownNameError

if TYPE_CHECKING:
    from onnxblocks.runtime.schedules import ReduceLROnPlateau, Schedule
    from onnxblocks.runtime.session import TrainingSession

#: Checkpoint property with the training data's state (``ArrayBatches.state_dict()``).
DATA_PROPERTY = "onnxblocks.data"
#: Checkpoint property with the schedule's settings (``Schedule.state_dict()``).
SCHEDULE_PROPERTY = "onnxblocks.schedule"


@dataclass
class History:
    """What :func:`fit` recorded.

    Attributes:
        losses: The loss of every ``train_step`` (micro-batch), in order.
        learning_rates: The learning rate of every optimizer step.
        epochs: One dict per epoch: ``epoch`` (1-based), ``loss`` (mean train
            loss), ``eval_loss`` and metrics when there was an eval pass.
        epoch_ends: For each epoch, ``len(losses)`` when it ended (to place
            per-epoch values on a per-step axis).
        steps: Optimizer steps taken by this ``fit`` call.
        samples: Training rows processed by this ``fit`` call.
        seconds: Wall time of this ``fit`` call.
    """

    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    epoch_ends: list[int] = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0

    def metric(self, name: str) -> list[float]:
        """The per-epoch values of ``name`` (``"loss"``, ``"eval_loss"``, ``"accuracy"`` ...).

        Raises:
            KeyError: if no epoch logged ``name``.
        """
        values = [e[name] for e in self.epochs if name in e]
        if not values:
            known = sorted({k for e in self.epochs for k in e})
            raise UnknownNameError(f"No epoch logged '{name}'. Logged: {known}.")
        return values

    def to_dict(self) -> dict[str, Any]:
        """A JSON-encodable copy."""
        return {
            "losses": list(self.losses),
            "learning_rates": list(self.learning_rates),
            "epochs": [dict(e) for e in self.epochs],
            "epoch_ends": list(self.epoch_ends),
            "steps": self.steps,
            "samples": self.samples,
            "seconds": self.seconds,
        }


@dataclass
class FitRun:
    """The state of a running :func:`fit`, given to every callback hook.

    Attributes:
        session: The training session.
        history: The history being recorded.
        train_data: The training data.
        epochs: The epoch to train up to.
        epoch: The current epoch (0-based).
        scheduler: The learning-rate schedule, or None.
        stop_training: Set to True in a callback to stop after the current batch.
    """

    session: TrainingSession
    history: History
    train_data: Any
    epochs: int
    epoch: int = 0
    scheduler: Schedule | ReduceLROnPlateau | None = None
    stop_training: bool = False

    def save_checkpoint(
        self, path: str | os.PathLike, include_optimizer_state: bool = True
    ) -> Path:
        """Save a checkpoint that :func:`resume` continues exactly (data and schedule state
        included).

        In data-parallel training only rank 0 writes it (the others return the path).
        """
        if not is_main_process(self.session):
            return Path(path)
        state_dict = getattr(self.train_data, "state_dict", None)
        values: dict[str, Any] = {
            # None overwrites what a checkpoint this session was resumed from said
            DATA_PROPERTY: state_dict() if callable(state_dict) else None,
            SCHEDULE_PROPERTY: self.scheduler.state_dict() if self.scheduler is not None else None,
        }
        return self.session._save(Path(path), include_optimizer_state, values)


def is_main_process(session: TrainingSession) -> bool:
    """False on the ranks other than 0 of data-parallel training
    (``session.gradient_reducer.rank``).
    """
    return int(getattr(session.gradient_reducer, "rank", 0)) == 0
