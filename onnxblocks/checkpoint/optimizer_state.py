"""The optimizer state a checkpoint holds, as one typed value.

ONNX Runtime's checkpoint keeps, per optimizer group, the optimizer steps taken,
the learning rate the group starts with and, per trainable parameter, its state
tensors in slot order (``momentum0``, ``momentum1``...: AdamW's first and second
moments, SGD's none). :class:`OptimizerState` is that layout: every reader of a
checkpoint (the backends, the web state file, the federated client, the
legacy torch API) takes its step, learning rate and moments from it, and every
writer hands one to :func:`~onnxblocks.checkpoint.save_checkpoint`.

ONNX Runtime writes a single group, ``group0``. Which group a session resumes
from is decided here only (:attr:`OptimizerState.primary`).

The dict form ``{group: {"step", "initial_learning_rate", "moments"}}`` works too, for code that
handles plain dicts: :class:`OptimizerState` reads as a mapping of groups by name, a group answers
``group["step"]``, ``group["initial_learning_rate"]`` and ``group["moments"]``, and
``save_checkpoint`` takes such a dict (:meth:`OptimizerState.of`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.contracts import OPTIMIZER_GROUP, checkpoint_moment_name
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
)

#: The keys of a group in the dict form ``save_checkpoint`` also takes.
_GROUP_KEYS = ("step", "initial_learning_rate", "moments")


@dataclass(frozen=True, eq=False)
class OptimizerGroup:
    """One optimizer group of a checkpoint.

    Attributes:
        name: The group's name (ONNX Runtime's single group is ``"group0"``).
        step: Optimizer steps taken (AdamW's bias correction counts them).
        initial_learning_rate: The learning rate a resumed session starts with.
        moments: Per trainable parameter, its state tensors in slot order (slot ``k`` is
            ONNX Runtime's ``momentum<k>``), kept as a read-only mapping of tuples;
            parameters without state are absent.

    Raises:
        InvalidTypeError, InvalidValueError: for a step or learning rate the session's
            setters would refuse, or moments that are not ``{param: [arrays]}``.
    """

    name: str = OPTIMIZER_GROUP
    step: int = 0
    initial_learning_rate: float = 0.0
    moments: Mapping[str, Sequence[np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidValueError(
                f"An optimizer group needs a non-empty str name, not {self.name!r:.40}."
            )
        where = f"optimizer group '{self.name}'"
        step = _hyper.step(self.step, f"the step of {where}")
        rate = _hyper.learning_rate(self.initial_learning_rate, f"the learning rate of {where}")
        if not isinstance(self.moments, Mapping):
            raise InvalidTypeError(
                f"The moments of {where} must be a mapping {{param: [arrays]}}, not "
                f"{type(self.moments).__name__}."
            )
        moments = {}
        for param, arrays in self.moments.items():
            if not isinstance(param, str) or isinstance(arrays, (str, bytes, np.ndarray)):
                raise InvalidTypeError(
                    f"The moments of {where} must be {{param name: [arrays in slot order]}}; "
                    f"got {param!r:.40}: {type(arrays).__name__}."
                )
            moments[param] = tuple(arrays)
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "initial_learning_rate", rate)
        object.__setattr__(self, "moments", MappingProxyType(moments))

    def slots(self, param: str) -> tuple[np.ndarray, ...]:
        """The state tensors of ``param`` in slot order (empty when it has none)."""
        return tuple(self.moments.get(param, ()))

    def slot_names(self, param: str) -> tuple[str, ...]:
        """The checkpoint's names of ``param``'s state tensors: ``momentum0``, ``momentum1``..."""
        return tuple(checkpoint_moment_name(k) for k in range(len(self.slots(param))))

    def __getitem__(self, key: str) -> Any:
        """The dict form's fields (``"step"``, ``"initial_learning_rate"``, ``"moments"``)."""
        if key not in _GROUP_KEYS:
            raise UnknownNameError(
                f"An optimizer group has no field '{key}'; it has {list(_GROUP_KEYS)}."
                f"{did_you_mean(key, _GROUP_KEYS)}"
            )
        return getattr(self, key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OptimizerGroup):
            return NotImplemented
        return (
            (self.name, self.step, self.initial_learning_rate)
            == (other.name, other.step, other.initial_learning_rate)
            and self.moments.keys() == other.moments.keys()
            and all(
                len(a) == len(other.moments[p])
                and all(np.array_equal(x, y) for x, y in zip(a, other.moments[p], strict=True))
                for p, a in self.moments.items()
            )
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class OptimizerState(Mapping[str, OptimizerGroup]):
    """A checkpoint's optimizer state: its groups, read as a mapping by group name.

    Attributes:
        groups: The groups, in file order (names unique).

    The session-facing accessors answer for the group a session resumes from
    (:attr:`primary`): :attr:`step`, :attr:`initial_learning_rate`,
    :meth:`slots` and :meth:`moment`. An empty state (no group) reads as step 0,
    no learning rate and no moments.
    """

    groups: tuple[OptimizerGroup, ...] = ()

    def __post_init__(self) -> None:
        groups = tuple(self.groups)
        for g in groups:
            if not isinstance(g, OptimizerGroup):
                raise InvalidTypeError(
                    f"OptimizerState takes OptimizerGroup values, not {type(g).__name__}."
                )
        names = [g.name for g in groups]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise InvalidValueError(f"Optimizer groups {repeated} appear more than once.")
        object.__setattr__(self, "groups", groups)

    @classmethod
    def single(
        cls,
        step: int,
        initial_learning_rate: float,
        moments: Mapping[str, Sequence[np.ndarray]],
        name: str = OPTIMIZER_GROUP,
    ) -> OptimizerState:
        """A state of one group (ONNX Runtime's ``group0`` by default)."""
        return cls((OptimizerGroup(name, step, initial_learning_rate, moments),))

    @classmethod
    def of(cls, value: OptimizerState | Mapping[str, Any]) -> OptimizerState:
        """``value`` as a state: itself, or the dict form ``{group: {"step": int,
        "initial_learning_rate": float, "moments": {param: [arrays]}}}``.

        Raises:
            InvalidTypeError: for a value that is neither.
            InvalidValueError: for a group that lacks a field or holds a bad value.
        """
        if isinstance(value, OptimizerState):
            return value
        if not isinstance(value, Mapping):
            raise InvalidTypeError(
                "optimizer_state must be an OptimizerState or a mapping {group: {'step', "
                f"'initial_learning_rate', 'moments'}}, not {type(value).__name__}."
            )
        groups = []
        for name, group in value.items():
            if isinstance(group, OptimizerGroup):
                groups.append(replace(group, name=name))
                continue
            missing = [k for k in _GROUP_KEYS if not isinstance(group, Mapping) or k not in group]
            if not isinstance(name, str) or missing:
                raise InvalidValueError(
                    f"optimizer group {name!r} must be named by a str and hold 'step', "
                    f"'initial_learning_rate' and 'moments'; it lacks {missing}."
                )
            moments = group["moments"]
            groups.append(
                OptimizerGroup(
                    name,
                    group["step"],
                    group["initial_learning_rate"],
                    dict(moments) if isinstance(moments, Mapping) else moments,
                )
            )
        return cls(tuple(groups))

    # ------------------------------------------------------------ the group a session uses
    @property
    def primary(self) -> OptimizerGroup | None:
        """The group a session resumes from: ONNX Runtime's ``group0``, else the first; None
        when there is none.
        """
        return next((g for g in self.groups if g.name == OPTIMIZER_GROUP), None) or next(
            iter(self.groups), None
        )

    def group_of(self, param: str) -> OptimizerGroup | None:
        """The group holding ``param``'s state tensors, else :attr:`primary`."""
        return next((g for g in self.groups if param in g.moments), None) or self.primary

    @property
    def step(self) -> int:
        """Optimizer steps taken (0 without a group)."""
        group = self.primary
        return group.step if group is not None else 0

    @property
    def initial_learning_rate(self) -> float | None:
        """The learning rate a resumed session starts with (None without a group)."""
        group = self.primary
        return group.initial_learning_rate if group is not None else None

    def slots(self, param: str) -> tuple[np.ndarray, ...]:
        """The state tensors of ``param`` in slot order (empty when it has none)."""
        group = self.group_of(param)
        return group.slots(param) if group is not None else ()

    def moment(self, param: str, slot: int | str) -> np.ndarray:
        """State tensor ``slot`` of ``param``: an index, or its checkpoint name (``momentum1``).

        Raises:
            UnknownNameError: when the state holds no such tensor.
        """
        held = self.slots(param)
        names = [checkpoint_moment_name(k) for k in range(len(held))]
        index = names.index(slot) if slot in names else slot
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(held):
            return held[index]
        raise UnknownNameError(
            f"The optimizer state holds no slot {slot!r} of '{param}' (it holds {names or 'none'})."
        )

    # ------------------------------------------------------------ mapping of groups by name
    def __getitem__(self, name: str) -> OptimizerGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise UnknownNameError(
            f"The optimizer state has no group '{name}'; it has {list(self)}."
            f"{did_you_mean(name, list(self))}"
        )

    def __iter__(self) -> Iterator[str]:
        return (g.name for g in self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{g.name}: step {g.step}, lr {g.initial_learning_rate:g}, "
            f"{len(g.moments)} parameters with state"
            for g in self.groups
        )
        return f"OptimizerState({inner})"
