"""What a session's checkpoint holds besides the model's state: the weight average.

:class:`WeightAverage` is the exponential moving average of the trainable weights
that the ``WeightEMA`` callback (:mod:`onnxblocks.runtime.ema`) updates during
``fit``, and this module is where it meets the checkpoint. A checkpoint a session
saves while it holds an average keeps it as frozen tensors
``onnxblocks.extra/ema/<parameter>`` and the decay and update count in the property
``onnxblocks.ema``. ONNX Runtime's training API loads and saves such a checkpoint as
any other (the model never reads those tensors); onnxblocks leaves them out of the
model's parameters. Loading the checkpoint restores the average
(:func:`average_from_checkpoint`).

The session depends on this module only, not on the callbacks: the callback builds on
the value, the value knows nothing of the training loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidValueError, StateError
from onnxblocks.checkpoint import load_checkpoint, save_checkpoint
from onnxblocks.checkpoint.save import EXTRA_PREFIX

#: The checkpoint's frozen tensors of the average: ``onnxblocks.extra/ema/<parameter>``.
EMA_PREFIX = f"{EXTRA_PREFIX}ema/"
#: The checkpoint property holding ``{"decay": d, "updates": n}``.
EMA_PROPERTY = "onnxblocks.ema"
#: The key of the update count in an ``.npz`` file of :meth:`WeightAverage.save`.
_UPDATES = "__weight_ema_updates__"


class ParameterHolder(Protocol):
    """What :meth:`WeightAverage.applied` swaps weights in: a training session."""

    def parameters(self, trainable_only: bool = False) -> dict[str, np.ndarray]: ...

    def set_parameters(self, values: Mapping[str, Any]) -> None: ...


Holder = TypeVar("Holder", bound=ParameterHolder)


class WeightAverage:
    """The exponential moving average of the trainable weights.

    It keeps torch's ``AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))``
    average: the first update copies the parameters, each later one moves the average
    towards them, ``ema = lerp(ema, w, 1 - decay)`` (rounded once, as torch's fused
    multiply-add).

    Args:
        decay: The average's decay per update, in ``[0, 1)``.

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

    @contextmanager
    def applied(self, session: Holder) -> Iterator[Holder]:
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
        return f"{type(self).__name__}(decay={self.decay!r}, updates={self.updates})"


def average_from_checkpoint(
    properties: Mapping[str, Any], frozen: Mapping[str, np.ndarray]
) -> WeightAverage | None:
    """The average a checkpoint holds, or None.

    Args:
        properties: The checkpoint's properties, decoded.
        frozen: Its frozen tensors, as read (the average's among them).

    Raises:
        InvalidValueError: for an ``onnxblocks.ema`` property that is not ``{"decay": d,
            "updates": n}``.
    """
    info = properties.get(EMA_PROPERTY)
    if info is None:
        return None
    tensors = {n: v for n, v in frozen.items() if n.startswith(EMA_PREFIX)}
    if not tensors:
        return None
    if (
        not isinstance(info, dict)
        or not isinstance(info.get("updates"), int)
        or info["updates"] < 1
    ):
        raise InvalidValueError(
            f"The checkpoint property '{EMA_PROPERTY}' is {info!r:.80}, not {{'decay': d, "
            "'updates': n}: save the checkpoint again from a session with a WeightEMA."
        )
    average = WeightAverage(info.get("decay", 0.999))
    average.average = {n[len(EMA_PREFIX) :]: np.array(v, copy=True) for n, v in tensors.items()}
    average.updates = info["updates"]
    return average


def average_property(average: WeightAverage | None) -> dict[str, Any] | None:
    """The ``onnxblocks.ema`` property value of ``average`` (None without one)."""
    if average is None or average.average is None:
        return None
    return {"decay": average.decay, "updates": average.updates}


def write_average(path: Path, average: WeightAverage | None) -> None:
    """Rewrite the checkpoint ``path`` with the average as its ``EMA_PREFIX`` frozen tensors (or
    none).
    """
    checkpoint = load_checkpoint(path)
    frozen: dict[str, Any] = {
        n: v for n, v in checkpoint.frozen.items() if not n.startswith(EMA_PREFIX)
    }
    if average is not None and average.average is not None:
        frozen |= {f"{EMA_PREFIX}{n}": v for n, v in average.average.items()}
    save_checkpoint(
        (checkpoint.trainable, frozen),
        path,
        optimizer_state=checkpoint.optimizer_state or None,
        properties=checkpoint.properties,
    )
