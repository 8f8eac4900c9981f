"""An exponential moving average of the weights during :func:`~onnxblocks.runtime.fit.fit`.

``WeightEMA(decay)`` is a callback that keeps, after every optimizer step, the
average torch's ``AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))``
keeps: the first update copies the trainable parameters, each later one moves the
average towards them, ``ema = lerp(ema, w, 1 - decay)`` (rounded once, as torch's
fused multiply-add). :meth:`WeightEMA.applied` puts the averaged weights into the
session for an evaluation or an export (``session.export_inference_model(...)`` inside it exports
them instead of the raw weights) and puts the raw ones back after; :meth:`WeightEMA.save`
and :meth:`WeightEMA.load` keep the average in an ``.npz`` file beside the checkpoint
(ONNX Runtime's checkpoint layout has no slot for it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidValueError, StateError
from onnxblocks.runtime.callbacks import Callback

if TYPE_CHECKING:
    from onnxblocks.runtime.fit import FitRun
    from onnxblocks.runtime.session import TrainingSession


class WeightEMA(Callback):
    """The exponential moving average of the trainable weights (see the module docs).

    Args:
        decay: The average's decay per optimizer step, in ``[0, 1)``.

    Raises:
        InvalidValueError: for a decay outside ``[0, 1)``.
    """

    def __init__(self, decay: float = 0.999) -> None:
        self.decay = _hyper.beta(decay, "WeightEMA decay")
        self.average: dict[str, np.ndarray] | None = None
        self.updates = 0

    def update(self, parameters: dict[str, np.ndarray]) -> None:
        """Fold the current trainable parameters into the average."""
        if self.average is None:
            self.average = {n: np.array(v, copy=True) for n, v in parameters.items()}
        else:
            weight = 1.0 - self.decay
            for name, value in parameters.items():
                ema = self.average[name]
                moved = ema.astype(np.float64) + np.float64(np.float32(weight)) * (value - ema).astype(np.float64)
                self.average[name] = moved.astype(ema.dtype)
        self.updates += 1

    def on_step_end(self, run: FitRun) -> None:
        self.update(run.session.parameters(trainable_only=True))

    @contextmanager
    def applied(self, session: TrainingSession) -> Iterator[TrainingSession]:
        """The session with the averaged weights in place of its trainable ones, restored on exit.

        Raises:
            StateError: before the first update.
        """
        if self.average is None:
            raise StateError("WeightEMA holds no average yet: it is updated after each optimizer step of fit().")
        raw = session.parameters(trainable_only=True)
        session.set_parameters(self.average)
        try:
            yield session
        finally:
            session.set_parameters(raw)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the average and its update count as an ``.npz`` file (``np.load`` reads it without pickles)."""
        if self.average is None:
            raise StateError("WeightEMA holds no average yet: nothing to save.")
        target = Path(os.fspath(path))
        arrays: dict[str, np.ndarray] = {**self.average, _UPDATES: np.array(self.updates, np.int64)}
        with target.open("wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds narrowly
        return target

    def load(self, path: str | os.PathLike) -> None:
        """Read an average written by :meth:`save`.

        Raises:
            InvalidValueError: for a file without the update count.
        """
        with np.load(Path(os.fspath(path)), allow_pickle=False) as data:
            arrays = {k: np.array(data[k]) for k in data.files}
        if _UPDATES not in arrays:
            raise InvalidValueError(f"'{path}' is not a WeightEMA file (no update count). Write it with save().")
        self.updates = int(arrays.pop(_UPDATES))
        self.average = arrays

    def __repr__(self) -> str:
        return f"WeightEMA(decay={self.decay!r}, updates={self.updates})"


#: The key of the update count in the saved file.
_UPDATES = "__weight_ema_updates__"

__all__ = ["WeightEMA"]
