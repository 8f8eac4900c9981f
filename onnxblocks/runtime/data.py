"""Batches of numpy arrays, shuffled reproducibly, with a state that checkpoints can hold.

:class:`ArrayBatches` cuts aligned arrays (features, labels ...) into batches.
Its position (epoch, batch within the epoch, and the random generator's state at
the start of the epoch) is a small JSON-encodable dict, so a checkpoint saved in
the middle of an epoch resumes with exactly the batches that would have come next.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from onnxblocks._core.errors import (
    FileAccessError,
    FileMissingError,
    InvalidValueError,
    IsAFolderError,
    UnknownNameError,
)


class ArrayBatches:
    """Iterate over aligned arrays in batches, one epoch per ``iter()``.

    Each ``iter()`` yields the remaining batches of the current epoch as tuples
    of arrays (one per input array, in order); when the epoch is exhausted,
    :attr:`epoch` advances and the next ``iter()`` starts a new permutation.

    Args:
        arrays: Arrays with the same first dimension (e.g. ``(x, labels)``).
        batch_size: Rows per batch.
        shuffle: Draw a new permutation of the rows at each epoch.
        seed: Seed of the permutation generator (``numpy.random.default_rng``).
        drop_last: Leave out the last batch of an epoch when it is smaller.
        shard: ``(rank, world_size)`` for data-parallel training: each epoch's permutation
            (the same on every rank, from ``seed``) is cut to a multiple of ``world_size``
            rows and rank ``r`` takes rows ``r, r + world_size, ...`` of it, so batch ``k``
            of the ranks together is batch ``k`` of ``batch_size * world_size`` rows.

    Attributes:
        epoch: Epochs completed.
        position: Batches handed out in the current epoch.

    Raises:
        ValueError: if the arrays are empty, have different lengths, or
            ``batch_size`` is not positive.
    """

    def __init__(
        self,
        arrays: Sequence[np.ndarray],
        batch_size: int,
        shuffle: bool = True,
        seed: int | None = 0,
        drop_last: bool = False,
        shard: tuple[int, int] = (0, 1),
    ) -> None:
        if isinstance(arrays, np.ndarray):
            arrays = (arrays,)
        self.arrays = tuple(np.asarray(a) for a in arrays)
        if not self.arrays:
            raise InvalidValueError("ArrayBatches needs at least one array.")
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            shapes = ", ".join(str(a.shape) for a in self.arrays)
            raise InvalidValueError(
                f"ArrayBatches: the arrays must have the same first dimension; got shapes {shapes}."
            )
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise InvalidValueError(
                f"ArrayBatches: batch_size must be an int >= 1, got {batch_size!r}."
            )
        self.num_rows = lengths.pop()
        if self.num_rows == 0:
            raise InvalidValueError("ArrayBatches: the arrays have no rows.")
        self.batch_size = int(batch_size)
        rank, world = shard
        if not 0 <= rank < world or world > self.num_rows:
            raise InvalidValueError(
                f"ArrayBatches: shard must be (rank, world_size) with 0 <= rank < world_size <= "
                f"the number of rows ({self.num_rows}), got {shard!r}."
            )
        self.shard = (int(rank), int(world))
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        self._rng = np.random.default_rng(seed)
        self._epoch_rng_state: dict[str, Any] | None = None
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.num_rows // self.shard[1], self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def batches_left(self) -> int:
        """Batches left in the current epoch."""
        return len(self) - self.position

    def _start_epoch(self) -> np.ndarray:
        if self._order is None:
            self._epoch_rng_state = dict(copy.deepcopy(self._rng.bit_generator.state))
            self._order = (
                self._rng.permutation(self.num_rows) if self.shuffle else np.arange(self.num_rows)
            )
            rank, world = self.shard
            if world > 1:
                self._order = self._order[: self.num_rows // world * world][rank::world]
        return self._order

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        order = self._start_epoch()
        while self.position < len(self):
            start = self.position * self.batch_size
            rows = order[start : start + self.batch_size]
            self.position += 1
            yield tuple(a[rows] for a in self.arrays)
        self.epoch += 1
        self.position = 0
        self._order = None

    def state_dict(self) -> dict[str, Any]:
        """Epoch, position and generator state, JSON-encodable, for checkpoints."""
        self._start_epoch()
        return {
            "epoch": self.epoch,
            "position": self.position,
            "rng": copy.deepcopy(self._epoch_rng_state),
            "num_rows": self.num_rows,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (taken from the same arrays and batch size).

        Raises:
            ValueError: if the state was taken with a different number of rows or batch size.
        """
        for key, mine in (("num_rows", self.num_rows), ("batch_size", self.batch_size)):
            if key in state and state[key] != mine:
                raise InvalidValueError(
                    f"ArrayBatches: the saved data state has {key}={state[key]}, but these "
                    "batches have "
                    f"{key}={mine}. Resume with the same data and batch size."
                )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._rng.bit_generator.state = copy.deepcopy(state["rng"])
        self._order = None
        self._start_epoch()

    def __repr__(self) -> str:
        shapes = ", ".join(str(a.shape) for a in self.arrays)
        return (
            f"ArrayBatches([{shapes}], batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"epoch={self.epoch}, position={self.position})"
        )


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, by name (loaded eagerly, no pickles).

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it is not a readable ``.npz`` archive (corrupt, truncated, pickled); the
        message names it.
        IsADirectoryError, PermissionError: for a folder, or a file that may not be read.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileMissingError(
            f"Data file '{path}' does not exist. Pass an .npz file (numpy.savez)."
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            if not hasattr(archive, "files"):
                raise InvalidValueError("not an .npz archive")
            return {name: archive[name] for name in archive.files}
    except IsADirectoryError:
        raise IsAFolderError(
            f"Data file '{path}' is a folder; pass an .npz file (numpy.savez)."
        ) from None
    except PermissionError:
        raise FileAccessError(
            f"Data file '{path}' may not be read (permission denied); check its permissions."
        ) from None
    except (
        Exception
    ) as exc:  # zipfile, zlib, numpy's format parser: a corrupt archive raises any of a dozen types
        raise InvalidValueError(
            f"Cannot read '{path}' as an .npz archive of arrays ({type(exc).__name__}: {exc}): "
            "the file is corrupt "
            "or not an .npz file. Write it again with numpy.savez."
        ) from None


def as_batch(raw: Any, names: Sequence[str]) -> tuple:
    """One batch as a tuple of arrays in ``names`` order (a bare array, a dict by input name, or
    a sequence).
    """
    if isinstance(raw, np.ndarray):
        return (raw,)
    if isinstance(raw, Mapping):
        missing = [n for n in names if n not in raw]
        if missing:
            raise UnknownNameError(
                f"The batch dict has no array for input(s) {missing}; it has {sorted(raw)}. "
                f"The model's inputs are {list(names)}."
            )
        return tuple(raw[n] for n in names)
    return tuple(raw)


def batch_rows(batch: tuple) -> int:
    """The number of rows of a batch (its first array's leading dim; 1 for a scalar)."""
    first: tuple[int, ...] = np.shape(batch[0]) if batch else ()
    return int(first[0]) if first else 1


def batches_left(data: Any) -> int | None:
    """How many batches ``data`` still yields in this epoch, when it can tell (None otherwise)."""
    if isinstance(data, ArrayBatches):
        return data.batches_left
    try:
        return len(data)
    except TypeError:
        return None


def is_iterable(data: object) -> bool:
    """Whether ``data`` can be iterated over as batches (a str or bytes cannot)."""
    try:
        iter(data)  # type: ignore[call-overload]
    except TypeError:
        return False
    return not isinstance(data, (str, bytes))
