"""Server-side checks of what clients send back, before anything is aggregated.

A reply that fails a check is dropped for its round: the server logs the reason and records it
in the :class:`~onnxblocks.federated.history.FederatedHistory`, and the round completes with the
replies that passed. Each check returns the reason as a sentence, or None when the reply passes
(a precondition that fails is a reason, not an exception: a bad client must not stop the server).

What a training reply must hold (docs/federated.md, "What travels"):

* one ``ArrayRecord`` keyed by exactly the global model's trainable parameter names, each array
  of the global parameter's dtype and shape, every element finite;
* one ``MetricRecord`` with a positive finite ``num-examples`` and finite metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: The metric Flower's strategies weight the average by.
WEIGHT_KEY = "num-examples"

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
    missing = sorted(set(reference) - set(arrays))
    extra = sorted(set(arrays) - set(reference))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_names(missing)}")
        if extra:
            parts.append(f"unknown {_names(extra)}")
        return f"its parameter names do not match the global model's ({'; '.join(parts)})"
    for name, (dtype, shape) in reference.items():
        array = arrays[name]
        if not isinstance(array, np.ndarray):
            return f"parameter '{name}' is a {type(array).__name__}, not an array"
        if array.dtype != dtype or tuple(array.shape) != tuple(shape):
            return (
                f"parameter '{name}' is {array.dtype} with shape {tuple(array.shape)}; the global parameter is "
                f"{dtype} with shape {tuple(shape)}"
            )
        if array.dtype.kind in "fc" and not bool(np.isfinite(array).all()):
            bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
            return f"parameter '{name}' holds {bad} non-finite value(s) (NaN or infinity)"
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
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in values):
            return f"metric '{key}' is {raw!r:.60}, not a finite number"
    weight = metrics.get(WEIGHT_KEY)
    if WEIGHT_KEY in required and (isinstance(weight, list) or not weight or float(weight) <= 0):
        return f"metric '{WEIGHT_KEY}' is {weight!r}; it must be a positive number of training rows"
    return None


def check_train_reply(content: Any, reference: Specs) -> str | None:
    """Why a training reply's ``RecordDict`` must be dropped (None: it may be aggregated)."""
    array_records = list(content.array_records.values())
    if len(array_records) != 1:
        return f"it holds {len(array_records)} ArrayRecords; one (the trained parameters) is expected"
    try:
        arrays = {name: array.numpy() for name, array in array_records[0].items()}
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
