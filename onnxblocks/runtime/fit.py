"""fit(): the training loop over a :class:`~onnxblocks.runtime.session.TrainingSession`.

Example:
    >>> session = TrainingSession("artifacts")
    >>> train = ArrayBatches((x, y), batch_size=32, seed=0)
    >>> val = ArrayBatches((x_val, y_val), batch_size=256, shuffle=False)
    >>> history = fit(session, train, epochs=20, eval_data=val, callbacks=[Accuracy()],
    ...               scheduler=CosineAnnealingLR(1e-2, T_max=20 * len(train)))
    >>> history.losses[-1], history.metric("accuracy")[-1]

With ``accumulation_steps=1`` (the default) each batch is one
:meth:`~onnxblocks.runtime.session.TrainingSession.train_and_update` call: a
single run when the artifacts have a fused step model (portable artifacts).

Gradient accumulation: with ``accumulation_steps=N`` the optimizer steps once
every N batches, on the **sum** of their gradients (ONNX Runtime adds each
batch's gradients into its accumulation buffers). To train on the mean over the
N batches, build the loss scaled by ``1/N`` (``loss * (1 / N)`` in a Block) or
divide the learning rate of SGD by N. Batches left over at the end of an epoch
are applied as a smaller accumulation.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, UnknownNameError
from onnxblocks.runtime.callbacks import Callback
from onnxblocks.runtime.data import ArrayBatches, as_batch, batch_rows, batches_left, is_iterable
from onnxblocks.runtime.fit_state import (
    DATA_PROPERTY,
    FitRun,
    History,
    is_main_process,
)
from onnxblocks.runtime.progress import ProgressBar
from onnxblocks.runtime.schedules import ReduceLROnPlateau, Schedule
from onnxblocks.runtime.session import TrainingSession

__all__ = ["FitRun", "History", "evaluate", "fit", "is_main_process", "resume"]


def fit(
    session: TrainingSession,
    train_data: Iterable[Any],
    epochs: int = 1,
    eval_data: Iterable[Any] | None = None,
    callbacks: Sequence[Callback] = (),
    accumulation_steps: int = 1,
    scheduler: Schedule | ReduceLROnPlateau | None = None,
    progress: bool | ProgressBar = True,
    max_steps: int | None = None,
) -> History:
    """Train ``session`` on ``train_data`` for ``epochs`` epochs.

    Args:
        session: The training session (its artifacts need an optimizer model).
        train_data: Batches: an :class:`~onnxblocks.runtime.data.ArrayBatches`, or
            any re-iterable of tuples of arrays (one array per training input,
            in ``session.input_names`` order) or of dicts keyed by input name.
        epochs: The epoch to train up to. An ``ArrayBatches`` restored from a
            checkpoint (see :func:`resume`) starts at its saved epoch and batch.
        eval_data: Batches for an eval pass after each epoch (eval model inputs).
        callbacks: :class:`~onnxblocks.runtime.callbacks.Callback` objects, e.g.
            ``Accuracy()`` or ``SaveCheckpoint(path)``.
        accumulation_steps: Batches whose gradients are summed into one optimizer step.
        scheduler: A learning-rate :class:`~onnxblocks.runtime.schedules.Schedule`;
            it sets ``session.learning_rate = scheduler(session.step)`` before each
            optimizer step. A :class:`~onnxblocks.runtime.schedules.ReduceLROnPlateau`
            instead sets its rate, and is stepped with its ``monitor`` metric (``eval_loss``
            by default, or the epoch's training ``loss``) at the end of each epoch.
            None keeps the session's learning rate.
        progress: Show a progress bar on stderr (or pass a configured ``ProgressBar``).
        max_steps: Stop after this many optimizer steps of this call.

    Returns:
        The :class:`History` of this call.

    Raises:
        RuntimeError: if the artifacts have no optimizer model.
        ValueError: for bad arguments, or a batch whose dtype or shape does not fit
            (the message names the input, what it expects and what it got).
    """
    import time

    _hyper.count(accumulation_steps, "accumulation_steps", 1)
    _hyper.count(epochs, "epochs")
    if max_steps is not None and max_steps < 1:
        raise InvalidValueError(f"max_steps must be >= 1 or None, got {max_steps!r}.")
    session._require_optimizer()  # the clear "no optimizer model" error, before any work
    for name, data in (("train_data", train_data), ("eval_data", eval_data)):
        if (data is None and name == "train_data") or (data is not None and not is_iterable(data)):
            raise InvalidTypeError(
                f"fit: {name} must be an iterable of batches (an ArrayBatches, a list of "
                "(inputs...) tuples), not "
                f"{type(data).__name__} {data!r:.60}. Wrap arrays with "
                "onnxblocks.runtime.ArrayBatches((x, y), 32)."
            )
    if iter(train_data) is train_data and epochs > 1:
        raise InvalidValueError(
            "train_data is a one-shot iterator, so it would be empty after the first epoch. Pass "
            "a re-iterable "
            "(a list of batches, or onnxblocks.runtime.ArrayBatches) or use epochs=1."
        )
    bar = progress if isinstance(progress, ProgressBar) else (ProgressBar() if progress else None)
    if not is_main_process(session):  # data-parallel: rank 0 shows the progress
        bar = None
    history = History()
    guards = getattr(session, "_guards", None) if getattr(session, "check_inputs", False) else None
    for name, data, what in (
        ("train_data", train_data, "train_step"),
        ("eval_data", eval_data, "eval_step"),
    ):
        if guards is not None and isinstance(data, ArrayBatches):
            # all of it, before the first step: a label out of range in the last batch fails now,
            # not an epoch later
            guards[what].check(data.arrays, f"fit: {name}")
    run = FitRun(session, history, train_data, epochs, scheduler=scheduler)
    start_epoch = train_data.epoch if isinstance(train_data, ArrayBatches) else 0
    started = time.perf_counter()
    try:
        _run_epochs(run, start_epoch, eval_data, callbacks, accumulation_steps, bar, max_steps)
    finally:
        if bar is not None:
            bar.close()
    history.seconds = time.perf_counter() - started
    for cb in callbacks:
        cb.on_train_end(run)
    return history


def _run_epochs(
    run: FitRun,
    start_epoch: int,
    eval_data: Iterable[Any] | None,
    callbacks: Sequence[Callback],
    accumulation_steps: int,
    bar: ProgressBar | None,
    max_steps: int | None,
) -> None:
    session, history, train_data, epochs = run.session, run.history, run.train_data, run.epochs
    for cb in callbacks:
        cb.on_train_begin(run)
    for epoch in range(start_epoch, epochs):
        run.epoch = epoch
        for cb in callbacks:
            cb.on_epoch_begin(run)
        if bar is not None:
            bar.start_epoch(epoch + 1, epochs, batches_left(train_data))
        epoch_losses: list[float] = []
        names = session.input_names
        for raw in train_data:
            batch = as_batch(raw, names)
            # one step per batch: train, update and reset in one call (one run with a fused step
            # model)
            fused = accumulation_steps == 1 and session.accumulated_steps == 0
            if fused:
                _set_learning_rate(run)
                outputs = session.train_and_update(*batch)
            else:
                outputs = session.train_step(*batch)
            loss = _scalar(outputs[0])
            epoch_losses.append(loss)
            history.losses.append(loss)
            rows = batch_rows(batch)
            history.samples += rows
            for cb in callbacks:
                cb.on_batch_end(run, loss, outputs, batch)
            if fused:
                _step_taken(run, callbacks)
            elif session.accumulated_steps >= accumulation_steps:
                _optimizer_step(run, callbacks)
            if bar is not None:
                bar.update(
                    loss, rows, history.learning_rates[-1] if history.learning_rates else None
                )
            if run.stop_training or (max_steps is not None and history.steps >= max_steps):
                break
        if session.accumulated_steps > 0 and not run.stop_training:
            _optimizer_step(run, callbacks)
        logs: dict[str, float] = {"epoch": epoch + 1}
        if epoch_losses:
            logs["loss"] = float(np.mean(epoch_losses))
        if eval_data is not None:
            logs.update(evaluate(session, eval_data, callbacks, run))
        if isinstance(run.scheduler, ReduceLROnPlateau):
            run.scheduler.step(_monitored(logs, run.scheduler.monitor))
        for cb in callbacks:
            cb.on_epoch_end(run, logs)
        history.epochs.append(logs)
        history.epoch_ends.append(len(history.losses))
        if bar is not None:
            bar.end_epoch(_summary(logs))
        if run.stop_training or (max_steps is not None and history.steps >= max_steps):
            break


def evaluate(
    session: TrainingSession,
    data: Iterable[Any],
    callbacks: Sequence[Callback] = (),
    run: FitRun | None = None,
) -> dict[str, float]:
    """Run the eval model over ``data`` and return ``eval_loss`` (row-weighted mean) and metrics.

    Args:
        session: The training session (its artifacts need an eval model).
        data: Batches for the eval model, as for :func:`fit`.
        callbacks: Metric callbacks (e.g. ``Accuracy()``); each adds its result.
        run: The running fit, passed on to the callbacks (None outside fit).

    Returns:
        ``{"eval_loss": ..., <metric name>: ...}``.
    """
    for cb in callbacks:
        cb.on_eval_begin(run)
    total, rows = 0.0, 0
    for raw in data:
        batch = as_batch(raw, session.eval_input_names)
        outputs = session.eval_step(*batch)
        n = batch_rows(batch)
        total += _scalar(outputs[0]) * n
        rows += n
        for cb in callbacks:
            cb.on_eval_batch(run, outputs, batch)
    logs = {"eval_loss": total / rows if rows else math.nan}
    for cb in callbacks:
        cb.on_eval_end(run, logs)
    return logs


def resume(
    session: TrainingSession,
    checkpoint: str | os.PathLike,
    train_data: Any = None,
) -> dict[str, Any]:
    """Load a checkpoint saved during :func:`fit` and restore the data's position.

    After ``resume``, calling ``fit`` with the same arguments continues exactly
    where the saved run was: same parameters, optimizer moments, step counter
    (hence learning-rate schedule) and next batches.

    Args:
        session: The session to load into.
        checkpoint: A checkpoint written by ``SaveCheckpoint`` or ``FitRun.save_checkpoint``.
        train_data: The training data (e.g. ``ArrayBatches``) whose state to restore.

    Returns:
        The checkpoint's properties.

    Raises:
        ValueError: if ``train_data`` cannot restore the saved state.
    """
    properties = session.load_checkpoint(checkpoint)
    if train_data is not None and properties.get(DATA_PROPERTY) is not None:
        load = getattr(train_data, "load_state_dict", None)
        if not callable(load):
            raise InvalidValueError(
                f"The checkpoint holds a data position, but {type(train_data).__name__} cannot "
                "restore it "
                "(it has no load_state_dict). Use onnxblocks.runtime.ArrayBatches."
            )
        load(properties[DATA_PROPERTY])
    return properties


def _set_learning_rate(run: FitRun) -> None:
    """Set the scheduled learning rate for the next optimizer step and record the rate used."""
    session = run.session
    if isinstance(run.scheduler, ReduceLROnPlateau):
        session.learning_rate = run.scheduler.lr
    elif run.scheduler is not None:
        session.learning_rate = run.scheduler(int(session.step))
    run.history.learning_rates.append(session.learning_rate)


def _monitored(logs: Mapping[str, float], monitor: str) -> float:
    """The metric ``ReduceLROnPlateau`` follows, from the epoch's logs.

    Raises:
        UnknownNameError: when the epoch has no such metric (no eval data, or no such callback).
    """
    if monitor not in logs:
        raise UnknownNameError(
            f"ReduceLROnPlateau monitors '{monitor}', but the epoch's logs hold {sorted(logs)}. "
            "Pass eval_data (for "
            "'eval_loss') or the metric's callback, or monitor one of these."
        )
    return float(logs[monitor])


def _step_taken(run: FitRun, callbacks: Sequence[Callback]) -> None:
    run.history.steps += 1
    for cb in callbacks:
        cb.on_step_end(run)


def _optimizer_step(run: FitRun, callbacks: Sequence[Callback]) -> None:
    _set_learning_rate(run)
    run.session.optimizer_step()
    _step_taken(run, callbacks)


def _scalar(loss: np.ndarray) -> float:
    array = np.asarray(loss, dtype=np.float64)
    return float(array.reshape(-1)[0]) if array.size == 1 else float(array.mean())


def _summary(logs: Mapping[str, float]) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in logs.items() if k not in ("epoch", "loss"))
