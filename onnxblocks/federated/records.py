"""Parameters as Flower records: an ``ArrayRecord`` keyed by parameter name, and back."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np


def to_record(arrays: Mapping[str, np.ndarray]) -> Any:
    """An ``ArrayRecord`` holding ``arrays`` under their names (dtypes and shapes kept: a 0-d
    array stays 0-d).
    """
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({name: Array(np.asarray(a, order="C")) for name, a in arrays.items()})


def from_record(record: Any) -> dict[str, np.ndarray]:
    """The arrays of an ``ArrayRecord``, by name."""
    return {name: array.numpy() for name, array in record.items()}


def arrays_to_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    """``arrays`` as ``.npz`` bytes (what a bridge ClientApp and the relay exchange)."""
    buffer = io.BytesIO()
    # written member by member: np.savez takes names as keywords, and a parameter named "file"
    # or "allow_pickle" would be taken for its options
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def npz_to_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of ``.npz`` bytes (never unpickled)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as loaded:
        return {name: loaded[name] for name in loaded.files}
