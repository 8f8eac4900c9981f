"""Callbacks of :func:`onnxblocks.runtime.fit`: metrics, checkpoints, early stopping.

A callback subclasses :class:`Callback` and overrides the hooks it needs. Every
hook gets the :class:`~onnxblocks.runtime.fit_state.FitRun` (session, history, epoch,
``stop_training`` flag ...). Metrics are callbacks that read the eval outputs
and write their result into the epoch's logs::

    history = fit(session, train, epochs=10, eval_data=val, callbacks=[Accuracy()])
    history.metric("accuracy")   # one value per epoch
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxblocks._core.errors import InvalidIndexError, InvalidValueError, UnknownNameError
from onnxblocks._core.paths import as_path, check_output_file

if TYPE_CHECKING:
    from onnxblocks.runtime.fit_state import FitRun


class Callback:
    """Base class: every hook does nothing."""

    def on_train_begin(self, run: FitRun) -> None:
        """Before the first epoch."""

    def on_epoch_begin(self, run: FitRun) -> None:
        """At the start of each epoch (``run.epoch`` is 0-based)."""

    def on_batch_end(
        self, run: FitRun, loss: float, outputs: tuple[np.ndarray, ...], batch: tuple
    ) -> None:
        """After each ``train_step`` (micro-batch)."""

    def on_step_end(self, run: FitRun) -> None:
        """After each optimizer step (``run.session.step`` was incremented)."""

    def on_eval_begin(self, run: FitRun | None) -> None:
        """Before an eval pass."""

    def on_eval_batch(
        self, run: FitRun | None, outputs: tuple[np.ndarray, ...], batch: tuple
    ) -> None:
        """After each ``eval_step``, with the eval model's outputs (loss first) and the batch."""

    def on_eval_end(self, run: FitRun | None, logs: dict[str, float]) -> None:
        """After an eval pass; metrics write their results into ``logs``."""

    def on_epoch_end(self, run: FitRun, logs: dict[str, float]) -> None:
        """After each epoch, with the epoch's logs (train loss, eval loss, metrics)."""

    def on_train_end(self, run: FitRun) -> None:
        """After the last epoch (also when training stopped early)."""


class Accuracy(Callback):
    """Classification accuracy over an eval pass, logged as ``name``.

    Predictions are ``argmax(outputs[output], axis=-1)`` when the output has one
    more dimension than the target (class scores), else ``outputs[output] > threshold``
    (binary logits, with ``threshold=0``).

    Args:
        output: Index of the class scores in the eval outputs (0 is the loss, so
            the first ``additional_output_names`` entry is 1).
        target: Index of the labels in the batch tuple (default: the last array).
        name: Key of the result in the logs.
        threshold: Decision threshold for binary outputs.
    """

    def __init__(
        self, output: int = 1, target: int = -1, name: str = "accuracy", threshold: float = 0.0
    ) -> None:
        self.output = output
        self.target = target
        self.name = name
        self.threshold = threshold
        self._correct = 0
        self._count = 0

    def on_eval_begin(self, run: FitRun | None) -> None:
        self._correct = 0
        self._count = 0

    def on_eval_batch(
        self, run: FitRun | None, outputs: tuple[np.ndarray, ...], batch: tuple
    ) -> None:
        if self.output >= len(outputs) or -self.output > len(outputs):
            raise InvalidIndexError(
                f"Accuracy: output index {self.output} is out of range; the eval model has "
                f"{len(outputs)} "
                "output(s) (the loss first). Generate the artifacts with "
                "additional_output_names=[<logits>] "
                "and pass output=1."
            )
        scores = np.asarray(outputs[self.output])
        labels = np.asarray(batch[self.target])
        if scores.ndim == labels.ndim + 1:
            predicted = scores.argmax(axis=-1)
        else:
            predicted = (scores > self.threshold).astype(labels.dtype)
        if predicted.shape != labels.shape:
            raise InvalidValueError(
                f"Accuracy: predictions have shape {predicted.shape} but labels have shape "
                f"{labels.shape}. "
                "Check the output and target indices."
            )
        self._correct += int((predicted == labels).sum())
        self._count += labels.size

    @property
    def value(self) -> float:
        """Accuracy of the last eval pass (nan before any)."""
        return self._correct / self._count if self._count else math.nan

    def on_eval_end(self, run: FitRun | None, logs: dict[str, float]) -> None:
        logs[self.name] = self.value


class SaveCheckpoint(Callback):
    """Save resumable checkpoints during :func:`fit`.

    The checkpoint holds parameters, optimizer state and the step counter, plus
    the state of the training data (when it has ``state_dict()``, like
    :class:`~onnxblocks.runtime.data.ArrayBatches`) and of the schedule, so
    :func:`~onnxblocks.runtime.fit.resume` continues exactly.

    Args:
        path: Checkpoint file; ``{step}`` and ``{epoch}`` are filled in if present
            (e.g. ``"ckpt/step{step}"``), otherwise the file is overwritten.
        every_steps: Save after every this many optimizer steps (None: never).
        at_epoch_end: Save after each epoch.
        include_optimizer_state: Save optimizer moments (needed for exact resume).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        every_steps: int | None = None,
        at_epoch_end: bool = True,
        include_optimizer_state: bool = True,
    ) -> None:
        if every_steps is not None and (
            isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1
        ):
            raise InvalidValueError(
                f"SaveCheckpoint: every_steps must be an int >= 1 or None, got {every_steps!r}."
            )
        self.path = os.fspath(as_path(path, "SaveCheckpoint: path"))
        self._target(
            0, 1
        )  # a template that cannot be filled in is refused here, not after the first epoch
        self.every_steps = every_steps
        self.at_epoch_end = at_epoch_end
        self.include_optimizer_state = include_optimizer_state
        self.saved: list[Path] = []

    def _target(self, step: int, epoch: int) -> Path:
        try:
            return Path(self.path.format(step=step, epoch=epoch))
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise InvalidValueError(
                f"SaveCheckpoint: the path template {self.path!r} cannot be filled in "
                f"({type(exc).__name__}: {exc}); "
                "it may use {step} and {epoch} only (write a literal brace as {{ or }})."
            ) from None

    def on_train_begin(self, run: FitRun) -> None:
        """Check, before the first step, that the checkpoints can be written where the template
        says.
        """
        check_output_file(
            self._target(run.session.step, run.epoch + 1),
            "SaveCheckpoint: path",
            create_parents=True,
        )

    def _save(self, run: FitRun) -> None:
        target = self._target(run.session.step, run.epoch + 1)
        self.saved.append(run.save_checkpoint(target, self.include_optimizer_state))

    def on_step_end(self, run: FitRun) -> None:
        if self.every_steps and run.session.step % self.every_steps == 0:
            self._save(run)

    def on_epoch_end(self, run: FitRun, logs: dict[str, float]) -> None:
        if self.at_epoch_end:
            self._save(run)


class EarlyStopping(Callback):
    """Stop training when a logged value stops improving.

    Args:
        monitor: Key in the epoch logs (e.g. ``"eval_loss"`` or ``"accuracy"``).
        patience: Epochs without improvement before stopping.
        mode: ``"min"`` (lower is better) or ``"max"``.
        min_delta: Smallest change that counts as an improvement.
    """

    def __init__(
        self,
        monitor: str = "eval_loss",
        patience: int = 3,
        mode: str = "min",
        min_delta: float = 0.0,
    ):
        if mode not in ("min", "max"):
            raise InvalidValueError(f"EarlyStopping: mode must be 'min' or 'max', got {mode!r}.")
        self.monitor = monitor
        self.patience = patience
        self.mode = mode
        self.min_delta = min_delta
        self.best: float | None = None
        self.wait = 0

    def on_train_begin(self, run: FitRun) -> None:
        self.best = None
        self.wait = 0

    def on_epoch_end(self, run: FitRun, logs: dict[str, Any]) -> None:
        if self.monitor not in logs:
            raise UnknownNameError(
                f"EarlyStopping monitors '{self.monitor}', which the epoch logs do not have; "
                "they have "
                f"{sorted(logs)}. Pass eval_data (for eval_loss) or a metric callback."
            )
        current = float(logs[self.monitor])
        sign = 1.0 if self.mode == "min" else -1.0
        if self.best is None or sign * (self.best - current) > self.min_delta:
            self.best = current
            self.wait = 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            run.stop_training = True
