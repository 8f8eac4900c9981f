"""A client's optimizer state between rounds: read from a trained session, restored into the next
round's.

With ``keep-optimizer-state`` (docs/federated.md), a client keeps its optimizer's moments and step
counts between rounds instead of starting fresh. :func:`read_optimizer_state` takes them from a
session and :func:`write_optimizer_state` puts them back, both through the session's checkpoint API
(``save_checkpoint(include_optimizer_state=True)``, ``load_checkpoint``), so either backend works.
The moments are named ``optimizer/<param>/<slot>`` (:data:`MOMENT_KEY`).

:class:`KeptOptimizerState` is a flat record (moments by key, scalars by name) because that is what
Flower's ``Context.state`` holds; the checkpoint's typed value of the same state is
:class:`onnxblocks.checkpoint.OptimizerState`, which this module reads and writes through.
``OptimizerState`` is a deprecated alias of :class:`KeptOptimizerState`, importable from here for
one release with a DeprecationWarning naming ``KeptOptimizerState``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks import checkpoint as _ckpt
from onnxblocks._core.contracts import OPTIMIZER_GROUP, STEP_PROPERTY, checkpoint_moment_slot
from onnxblocks._core.errors import InvalidValueError, preview
from onnxblocks._core.moved import moved_names
from onnxblocks.runtime import TrainingSession

#: The name under which :class:`KeptOptimizerState` keeps a moment: ``optimizer/<param>/<slot>``.
MOMENT_KEY = "optimizer/{}/{}"


@dataclass
class KeptOptimizerState:
    """A session's optimizer state, as a client keeps it between rounds.

    Attributes:
        moments: The optimizer's moments by ``optimizer/<param>/<slot>`` (AdamW: slots
            ``momentum0`` and ``momentum1`` of each trainable parameter; SGD: none), in the
            parameters' dtypes and shapes.
        step: The optimizer's own step count (AdamW's bias correction counts it).
        initial_learning_rate: The optimizer group's initial learning rate.
        session_step: :attr:`TrainingSession.step <onnxblocks.runtime.TrainingSession.step>`
            (schedulers count it).
        group: The optimizer group's name in the checkpoint.
    """

    moments: dict[str, np.ndarray]
    step: int = 0
    initial_learning_rate: float = 0.0
    session_step: int = 0
    group: str = OPTIMIZER_GROUP

    def scalars(self) -> dict[str, Any]:
        """The scalars, by hyphenated name (what a Flower ``ConfigRecord`` holds)."""
        return {
            "step": int(self.step),
            "initial-learning-rate": float(self.initial_learning_rate),
            "session-step": int(self.session_step),
            "group": str(self.group),
        }

    @classmethod
    def from_parts(
        cls, moments: Mapping[str, np.ndarray], scalars: Mapping[str, Any]
    ) -> KeptOptimizerState:
        """The state from its moments and :meth:`scalars`.

        Raises:
            InvalidValueError: for a scalar missing or of the wrong kind.
        """
        try:
            return cls(
                dict(moments),
                step=_whole(scalars["step"], "step"),
                initial_learning_rate=float(scalars["initial-learning-rate"]),
                session_step=_whole(scalars["session-step"], "session-step"),
                group=str(scalars["group"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidValueError(
                f"The kept optimizer state's scalars {sorted(scalars)} are incomplete or "
                f"malformed ({exc!r:.80}); "
                "they are step, initial-learning-rate, session-step and group."
            ) from None


def _whole(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def read_optimizer_state(session: TrainingSession) -> KeptOptimizerState:
    """The optimizer state of ``session`` (either backend), read from a checkpoint it saves.

    Returns:
        The :class:`KeptOptimizerState` (arrays are copies).
    """
    with tempfile.TemporaryDirectory(prefix="onnxblocks-optimizer-") as temp:
        saved = _ckpt.load_checkpoint(
            session.save_checkpoint(Path(temp) / "state", include_optimizer_state=True)
        )
        group = saved.optimizer_state.primary or _ckpt.OptimizerGroup()
        moments = {
            MOMENT_KEY.format(param, name): np.array(array, copy=True)
            for param, arrays in group.moments.items()
            for name, array in zip(group.slot_names(param), arrays, strict=True)
        }
        return KeptOptimizerState(
            moments,
            step=group.step,
            initial_learning_rate=group.initial_learning_rate,
            session_step=session.step,
            group=group.name,
        )


def write_optimizer_state(session: TrainingSession, state: KeptOptimizerState) -> None:
    """Restore ``state`` into ``session``, keeping its parameters (either backend).

    The session saves a checkpoint, the optimizer group and step counter in it are replaced with
    ``state``'s, and the session loads it back (on the training build that reopens the session).

    Raises:
        InvalidValueError: when ``state`` does not fit the session's trainable parameters (a moment
        of an
            unknown parameter, of another shape or dtype, or a slot missing).
    """
    trainable = session.parameters(trainable_only=True)
    moments: dict[str, dict[int, np.ndarray]] = {}
    for key, array in state.moments.items():
        parts = key.split("/")
        slot = parts[-1] if len(parts) == 3 and parts[0] == "optimizer" else ""
        index = checkpoint_moment_slot(slot)
        param = parts[1] if len(parts) == 3 else key
        if index is None or param not in trainable:
            raise InvalidValueError(
                f"The kept optimizer state holds '{key}', which is not 'optimizer/<trainable "
                "parameter>/momentum<i>' "
                f"of these artifacts (trainable: {preview(list(trainable))})."
            )
        value = np.asarray(array)
        if value.dtype != trainable[param].dtype or value.shape != trainable[param].shape:
            raise InvalidValueError(
                f"The kept optimizer state's '{key}' is {value.dtype} {value.shape}; parameter "
                f"'{param}' is "
                f"{trainable[param].dtype} {trainable[param].shape}."
            )
        moments.setdefault(param, {})[index] = value
    for param, slots in moments.items():
        if sorted(slots) != list(range(len(slots))):
            raise InvalidValueError(
                f"The kept optimizer state lacks a slot of '{param}' (it has {sorted(slots)})."
            )
    with tempfile.TemporaryDirectory(prefix="onnxblocks-optimizer-") as temp:
        saved = _ckpt.load_checkpoint(
            session.save_checkpoint(Path(temp) / "now", include_optimizer_state=True)
        )
        groups = _ckpt.OptimizerState.single(
            state.step,
            state.initial_learning_rate,
            {param: [slots[i] for i in range(len(slots))] for param, slots in moments.items()},
            name=state.group,
        )
        properties = {**saved.properties, STEP_PROPERTY: int(state.session_step)}
        path = _ckpt.save_checkpoint(
            (saved.trainable, saved.frozen),
            Path(temp) / "kept",
            optimizer_state=groups,
            properties=properties,
        )
        session.load_checkpoint(path)


#: ``OptimizerState``: the deprecated alias of :class:`KeptOptimizerState`, for one release; reading
#: it warns, because the name belongs to the checkpoint's typed state
#: (:class:`onnxblocks.checkpoint.OptimizerState`), another concept.
__getattr__ = moved_names(
    __name__,
    ("OptimizerState",),
    f"{__name__} under its name KeptOptimizerState",
    lambda name: KeptOptimizerState,
)
