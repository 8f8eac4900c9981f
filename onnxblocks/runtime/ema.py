"""An exponential moving average of the weights during :func:`~onnxblocks.runtime.fit.fit`.

``WeightEMA(decay)`` is a callback that keeps, after every optimizer step, the
average torch's ``AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))``
keeps: the first update copies the trainable parameters, each later one moves the
average towards them, ``ema = lerp(ema, w, 1 - decay)`` (rounded once, as torch's
fused multiply-add). :meth:`WeightEMA.applied` puts the averaged weights into the
session for an evaluation or an export (``session.export_inference_model(...)`` inside it exports
them instead of the raw weights) and puts the raw ones back after.

In the checkpoint: during ``fit`` the callback attaches itself to the session
(``session.weight_ema``), and every checkpoint the session saves holds the average
as frozen tensors ``onnxblocks.extra/ema/<parameter>`` (plus the decay and update
count in the property ``onnxblocks.ema``). ONNX Runtime's training API loads and
saves such a checkpoint as any other (the model never reads those tensors);
onnxblocks leaves them out of the model's parameters. Loading the checkpoint
(``resume``, ``load_checkpoint``, ``TrainingSession(checkpoint=...)``) restores the
average into ``session.weight_ema``, a fresh ``WeightEMA`` callback of the same decay
takes it over, and ``session.export_inference_model(path, use_ema=True)`` exports it.
:meth:`WeightEMA.save` and :meth:`WeightEMA.load` keep an ``.npz`` file instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidValueError, StateError
from onnxblocks.checkpoint import load_checkpoint, save_checkpoint
from onnxblocks.checkpoint.save import EXTRA_PREFIX
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
                moved = ema.astype(np.float64) + np.float64(np.float32(weight)) * (
                    value - ema
                ).astype(np.float64)
                self.average[name] = moved.astype(ema.dtype)
        self.updates += 1

    def on_train_begin(self, run: FitRun) -> None:
        """Attach to the session (its checkpoints hold the average); take over an average it
        restored.
        """
        restored = getattr(run.session, "weight_ema", None)
        if restored is not None and restored is not self and self.average is None:
            if restored.decay != self.decay:
                raise InvalidValueError(
                    f"The checkpoint holds a weight EMA of decay {restored.decay}, but this "
                    "WeightEMA has decay "
                    f"{self.decay}: pass WeightEMA({restored.decay}) to continue it."
                )
            self.average, self.updates = restored.average, restored.updates
        run.session.weight_ema = self

    def on_step_end(self, run: FitRun) -> None:
        self.update(run.session.parameters(trainable_only=True))

    @contextmanager
    def applied(self, session: TrainingSession) -> Iterator[TrainingSession]:
        """The session with the averaged weights in place of its trainable ones, restored on exit.

        Raises:
            StateError: before the first update.
        """
        if self.average is None:
            raise StateError(
                "WeightEMA holds no average yet: it is updated after each optimizer step of fit()."
            )
        raw = session.parameters(trainable_only=True)
        session.set_parameters(self.average)
        try:
            yield session
        finally:
            session.set_parameters(raw)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the average and its update count as an ``.npz`` file (``np.load`` reads it
        without pickles).
        """
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
            raise InvalidValueError(
                f"'{path}' is not a WeightEMA file (no update count). Write it with save()."
            )
        self.updates = int(arrays.pop(_UPDATES))
        self.average = arrays

    def __repr__(self) -> str:
        return f"WeightEMA(decay={self.decay!r}, updates={self.updates})"


#: The key of the update count in the saved file.
_UPDATES = "__weight_ema_updates__"
#: The checkpoint's frozen tensors of the average: ``onnxblocks.extra/ema/<parameter>``.
EMA_PREFIX = f"{EXTRA_PREFIX}ema/"
#: The checkpoint property holding ``{"decay": d, "updates": n}``.
EMA_PROPERTY = "onnxblocks.ema"


def ema_from_checkpoint(properties: dict[str, Any], path: Path) -> WeightEMA | None:
    """The average the checkpoint ``path`` holds (``properties``: its properties, decoded), or None.

    Raises:
        InvalidValueError: for an ``onnxblocks.ema`` property that is not ``{"decay": d, "updates":
        n}``.
    """
    info = properties.get(EMA_PROPERTY)
    if info is None:
        return None
    tensors = {n: v for n, v in load_checkpoint(path).frozen.items() if n.startswith(EMA_PREFIX)}
    if not tensors:
        return None
    if (
        not isinstance(info, dict)
        or not isinstance(info.get("updates"), int)
        or info["updates"] < 1
    ):
        raise InvalidValueError(
            f"The checkpoint property '{EMA_PROPERTY}' is {info!r:.80}, not {{'decay': d, "
            "'updates': n}: "
            "save the checkpoint again from a session with a WeightEMA."
        )
    ema = WeightEMA(info.get("decay", 0.999))
    ema.average = {n[len(EMA_PREFIX) :]: np.array(v, copy=True) for n, v in tensors.items()}
    ema.updates = info["updates"]
    return ema


def ema_property(ema: WeightEMA | None) -> dict[str, Any] | None:
    """The ``onnxblocks.ema`` property value of ``ema`` (None without an average)."""
    return (
        None if ema is None or ema.average is None else {"decay": ema.decay, "updates": ema.updates}
    )


def write_ema_tensors(path: Path, ema: WeightEMA | None) -> None:
    """Rewrite the checkpoint ``path`` with the average as its ``EMA_PREFIX`` frozen tensors (or
    none).
    """
    checkpoint = load_checkpoint(path)
    frozen: dict[str, Any] = {
        n: v for n, v in checkpoint.frozen.items() if not n.startswith(EMA_PREFIX)
    }
    if ema is not None and ema.average is not None:
        frozen |= {f"{EMA_PREFIX}{n}": v for n, v in ema.average.items()}
    save_checkpoint(
        (checkpoint.trainable, frozen),
        path,
        optimizer_state=checkpoint.optimizer_state or None,
        properties=checkpoint.properties,
    )


__all__ = ["WeightEMA"]
