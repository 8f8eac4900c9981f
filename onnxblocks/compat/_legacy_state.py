"""The legacy session's weights and optimizer state as the pre-1.15 API hands them out.

``get_state`` is one flat dict: the weights by name, then per weight its moments
(``Moment_1_<weight>``, ``Moment_2_<weight>``) and ``Update_Count_<weight>``
(the optimizer steps taken plus one). The optimizer state comes from, and goes
back into, the onnxblocks session's checkpoint (:class:`~onnxblocks.checkpoint.OptimizerState`),
so it works on either backend.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.contracts import STEP_PROPERTY
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
)
from onnxblocks.checkpoint import OptimizerState, load_checkpoint, save_checkpoint


def weights(session: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The trained weights ``names`` of an onnxblocks session, by name."""
    return {w: session.get_parameter(w) for w in names}


def optimizer_state(session: Any) -> dict[str, dict[str, np.ndarray]]:
    """``{weight: {"Moment_1": m, "Moment_2": v, "Update_Count": step}}`` (empty for SGD)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = session.save_checkpoint(Path(tmp) / "state", include_optimizer_state=True)
        state = load_checkpoint(path).optimizer_state
    out: dict[str, dict[str, np.ndarray]] = {}
    for group in state.groups:
        for weight, moments in group.moments.items():
            entry = {f"Moment_{i + 1}": np.array(m) for i, m in enumerate(moments)}
            if entry:
                out[weight] = {**entry, "Update_Count": np.array([group.step + 1], np.int64)}
    return out


def flat_state(session: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The weights and the optimizer state in one flat dict (``Moment_1_<weight>``,
    ``Update_Count_<weight>``).
    """
    state = weights(session, names)
    for weight, entries in optimizer_state(session).items():
        state.update({f"{key}_{weight}": value for key, value in entries.items()})
    return state


def load_flat_state(
    session: Any, names: Sequence[str], given: Mapping[str, Any], strict: bool
) -> None:
    """Set weights and optimizer state from a :func:`flat_state` dict; names it does not hold
    keep their values.

    Raises:
        UnknownNameError: for a name the session does not have (with ``strict``, also for one it
            lacks).
        InvalidValueError: for an array of the wrong shape, or ``Update_Count`` values that
            differ.
    """
    if not isinstance(given, Mapping):
        raise InvalidTypeError(
            f"load_state takes a dict {{name: array}}, not {type(given).__name__}."
        )
    current = flat_state(session, names)
    extra = [k for k in given if k not in current]
    missing = [k for k in current if k not in given] if strict else []
    if extra or missing:
        bad = (extra or missing)[0]
        raise UnknownNameError(
            f"load_state{'(strict=True)' if strict else ''}: "
            f"{'unknown name' if extra else 'missing entry'} "
            f"'{bad}'.{did_you_mean(bad, sorted(current))}"
        )
    values = {}
    for name, value in given.items():
        array = np.asarray(value, dtype=current[name].dtype)
        if array.shape != current[name].shape:
            raise InvalidValueError(
                f"load_state: '{name}' has shape {array.shape}; the session's is "
                f"{current[name].shape}."
            )
        values[name] = array
    session.set_parameters({k: v for k, v in values.items() if k in names})
    if any(k not in names for k in values):
        _load_optimizer_state(session, {**current, **values})


def _load_optimizer_state(session: Any, state: Mapping[str, np.ndarray]) -> None:
    counts = {int(v.reshape(-1)[0]) for k, v in state.items() if k.startswith("Update_Count_")}
    if len(counts) > 1:
        raise InvalidValueError(
            f"load_state: the Update_Count entries differ ({sorted(counts)}); give one value."
        )
    with tempfile.TemporaryDirectory() as tmp:
        saved = load_checkpoint(
            session.save_checkpoint(Path(tmp) / "now", include_optimizer_state=True)
        )
        groups = OptimizerState(
            tuple(
                dataclasses.replace(
                    group,
                    step=next(iter(counts)) - 1 if counts else group.step,
                    moments={
                        w: [state.get(f"Moment_{i + 1}_{w}", m) for i, m in enumerate(arrays)]
                        for w, arrays in group.moments.items()
                    },
                )
                for group in saved.optimizer_state.groups
            )
        )
        properties = dict(saved.properties)
        if STEP_PROPERTY in properties and groups:
            properties[STEP_PROPERTY] = groups.step
        target = Path(tmp) / "loaded"
        save_checkpoint(
            (_copied(saved.trainable), _copied(saved.frozen)),
            target,
            optimizer_state=groups,
            properties=properties,
        )
        session.load_checkpoint(target)


def _copied(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Arrays copied out of a checkpoint's memory maps (the file they map is about to be
    replaced).
    """
    return {name: np.array(value) for name, value in arrays.items()}
