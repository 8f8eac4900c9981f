"""Server-side checks of what clients send back, before anything is aggregated.

A reply that fails a check is dropped for its round: the server logs the reason and records it
in the :class:`~onnxblocks.federated.history.FederatedHistory`, and the round completes with the
replies that passed. Each check returns the reason as a sentence, or None when the reply passes
(a precondition that fails is a reason, not an exception: a bad client must not stop the server).

What a training reply must hold (docs/federated.md, "What travels"):

* one ``ArrayRecord`` keyed by exactly the global model's trainable parameter names, each array
  of the global parameter's dtype and shape, every element finite;
* one ``MetricRecord`` with a whole, positive ``num-examples`` of at most :data:`MAX_EXAMPLES` and
  finite metrics.

Nothing a client sends is trusted before it is checked: an array's ``.npy`` header is read (at most
:data:`MAX_HEADER_BYTES`) and its dtype, shape, layout and byte length compared with the global
parameter's before a byte of data is decoded, so an object or string array is never unpickled and a
header claiming a huge shape never allocates it.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.lib import format as npy

#: The metric Flower's strategies weight the average by.
WEIGHT_KEY = "num-examples"

#: The largest ``num-examples`` a reply may claim: every whole number up to it is exact as a float64
#: (Flower's strategies weight by it in floating point).
MAX_EXAMPLES = 2**53

#: The largest ``.npy`` header read from a client's array (numpy's own default bound).
MAX_HEADER_BYTES = 10_000

#: ``{name: (dtype, shape)}``: what the global parameters are.
Specs = Mapping[str, tuple[np.dtype, tuple[int, ...]]]


def specs_of(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The ``{name: (dtype, shape)}`` of ``arrays``."""
    return {name: (np.asarray(a).dtype, tuple(np.shape(a))) for name, a in arrays.items()}


def check_arrays(arrays: Mapping[str, Any], reference: Specs) -> str | None:
    """Why ``arrays`` cannot stand for the global parameters ``reference`` (None: they can).

    The names must be exactly the reference's, and each array of its dtype and shape with
    only finite elements.
    """
    reason = _check_names(list(arrays), reference)
    if reason is not None:
        return reason
    for name, (dtype, shape) in reference.items():
        array = arrays[name]
        if not isinstance(array, np.ndarray):
            return f"parameter '{name}' is a {type(array).__name__}, not an array"
        if array.dtype != dtype or tuple(array.shape) != tuple(shape):
            return (
                f"parameter '{name}' is {array.dtype} with shape {tuple(array.shape)}; the "
                "global parameter is "
                f"{dtype} with shape {tuple(shape)}"
            )
        if array.dtype.kind in "fc" and not bool(np.isfinite(array).all()):
            bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
            return f"parameter '{name}' holds {bad} non-finite value(s) (NaN or infinity)"
    return None


def _check_names(names: list[Any], reference: Specs) -> str | None:
    """Why ``names`` are not exactly the global parameters' names (None: they are)."""
    odd = [n for n in names if not isinstance(n, str)]
    if odd:
        return f"its parameter names include {len(odd)} that are not strings"
    missing = sorted(set(reference) - set(names))
    extra = sorted(set(names) - set(reference))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_names(missing)}")
        if extra:
            parts.append(f"unknown {_names(extra)}")
        return f"its parameter names do not match the global model's ({'; '.join(parts)})"
    return None


def check_metrics(metrics: Mapping[str, Any], required: tuple[str, ...]) -> str | None:
    """Why a reply's metrics cannot be aggregated (None: they can).

    The ``required`` keys must be present, every value a finite number (or a list of them), and
    ``num-examples`` positive.
    """
    absent = [key for key in required if key not in metrics]
    if absent:
        return f"its metrics lack {_names(absent)} (it sent {_names(sorted(metrics))})"
    for key, raw in metrics.items():
        values = raw if isinstance(raw, list) else [raw]
        if not all(_finite_number(v) for v in values):
            return f"metric '{key}' is {raw!r:.60}, not a finite number"
    weight = metrics.get(WEIGHT_KEY)
    if WEIGHT_KEY in required and not _row_count(weight):
        return (
            f"metric '{WEIGHT_KEY}' is {weight!r:.60}; it must be a whole number of training "
            "rows from 1 to "
            f"{MAX_EXAMPLES}"
        )
    return None


def _finite_number(value: Any) -> bool:
    """An int or float (not a bool) with a finite float value (an int too large for a float64 is
    not).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    try:
        return bool(np.isfinite(float(value)))
    except OverflowError:
        return False


def _row_count(value: Any) -> bool:
    """A whole number in ``[1, MAX_EXAMPLES]`` (ints, and floats holding whole numbers:
    evaluation replies).
    """
    if isinstance(value, list) or not _finite_number(value):
        return False
    if isinstance(value, (int, np.integer)):
        return 1 <= int(value) <= MAX_EXAMPLES
    number = float(value)
    return number.is_integer() and 1 <= number <= MAX_EXAMPLES


def check_header(array: Any, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> str | None:
    """Why a Flower ``Array`` cannot be decoded as the global parameter ``name`` (None: it can).

    Reads only the ``.npy`` header of ``array.data`` (version 1 or 2, at most
    :data:`MAX_HEADER_BYTES`):
    its dtype and shape must be the parameter's, and the payload exactly that many bytes
    after the header. Nothing is unpickled or allocated from what the client claims.
    """
    data = getattr(array, "data", None)
    if getattr(array, "stype", None) != "numpy.ndarray" or not isinstance(data, bytes):
        return (
            f"parameter '{name}' is not a serialized numpy array (stype "
            f"{getattr(array, 'stype', None)!r:.40})"
        )
    stream = io.BytesIO(data)
    try:
        version = npy.read_magic(stream)
        if version == (1, 0):
            got_shape, _, got_dtype = npy.read_array_header_1_0(
                stream, max_header_size=MAX_HEADER_BYTES
            )
        elif version == (2, 0):
            got_shape, _, got_dtype = npy.read_array_header_2_0(
                stream, max_header_size=MAX_HEADER_BYTES
            )
        else:
            return f"parameter '{name}' is in .npy format version {version}; 1.0 or 2.0 is expected"
    except Exception as exc:  # any malformed header (numpy raises ValueError, SyntaxError, ...)
        return f"parameter '{name}' has no readable .npy header ({type(exc).__name__}: {exc!s:.80})"
    if got_dtype != dtype or tuple(got_shape) != tuple(shape):
        return (
            f"parameter '{name}' is {got_dtype} with shape {tuple(got_shape)}; the global "
            "parameter is "
            f"{dtype} with shape {tuple(shape)}"
        )
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    held = len(data) - stream.tell()
    if held != need:
        return f"parameter '{name}' holds {held} data bytes; its shape and dtype need {need}"
    return None


def check_train_reply(content: Any, reference: Specs) -> str | None:
    """Why a training reply's ``RecordDict`` must be dropped (None: it may be aggregated)."""
    array_records = list(content.array_records.values())
    if len(array_records) != 1:
        return (
            f"it holds {len(array_records)} ArrayRecords; one (the trained parameters) is expected"
        )
    record = array_records[0]
    reason = _check_names(list(record.keys()), reference)
    if reason is not None:
        return reason
    for name, (dtype, shape) in reference.items():
        reason = check_header(record[name], name, np.dtype(dtype), tuple(shape))
        if reason is not None:
            return reason
    try:
        arrays = {name: array.numpy() for name, array in record.items()}
    except Exception as exc:  # a malformed Array: its bytes do not decode (any of numpy's errors)
        return f"its arrays cannot be decoded ({type(exc).__name__}: {exc})"
    reason = check_arrays(arrays, reference)
    if reason is not None:
        return reason
    return _one_metric_record(content, (WEIGHT_KEY, "train-loss"))


def check_evaluate_reply(content: Any) -> str | None:
    """Why an evaluation reply's ``RecordDict`` must be dropped (None: it may be aggregated)."""
    return _one_metric_record(content, (WEIGHT_KEY, "eval-loss"))


def _one_metric_record(content: Any, required: tuple[str, ...]) -> str | None:
    records = list(content.metric_records.values())
    if len(records) != 1:
        return f"it holds {len(records)} MetricRecords; one is expected"
    return check_metrics(dict(records[0]), required)


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
