"""Parameter groups of an optimizer in standard ops: a rule applied per group, and the metadata that
records them.

A :class:`Layout` is what a layout (one tensor per parameter today, flattened
tensors later) needs to apply a rule of :mod:`onnxblocks.portable.rules`: the
groups' hyperparameters and learning-rate scales, each parameter's group, the state
slots and the element type. :class:`GroupUpdater` writes each group's scalars once
and the elementwise update per parameter or per flat buffer of a group's parameters
(``onnxblocks.portable.updates.update_parameters`` picks the layout). :func:`metadata` /
:func:`parse_metadata`
are the JSON an optimizer model built by :mod:`onnxblocks.optim` carries under
``onnxblocks.optimizer``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxblocks._core.errors import PortabilityError
from onnxblocks.portable.context import Writer
from onnxblocks.portable.rules import Rule, Scalars, compute_type, rule


@dataclass(frozen=True)
class Layout:
    """What a layout needs to apply a rule: the groups, each parameter's group, the state slots, the
    type.

    Attributes:
        rule: The algorithm.
        groups: Each group's ``{"hyper": ..., "lr_scale": ...}`` (the default group first).
        group_of: Each parameter's group index (parameters not named are in group 0).
        states: The state slots per parameter, in order.
        dtype: The parameters' numpy type.
        exact: Round as torch's CPU kernels do (fused multiply-adds and square roots in double);
        False
            writes them in the parameters' type (fewer passes, an ulp apart).
    """

    rule: Rule
    groups: Sequence[Mapping[str, Any]]
    group_of: Mapping[str, int]
    states: tuple[str, ...]
    dtype: np.dtype
    exact: bool = True


class GroupUpdater:
    """Writes a rule's update for one parameter (or a flat buffer of a group's parameters) at a
    time.

    Each group's scalars are written once, on first use.

    Args:
        w: The writer.
        layout: The rule, groups and state slots.
        learning_rate: The float ``[1]`` learning rate (the default group's; a group scales it by
        its ``lr_scale``).
        step: The int64 ``[1]`` step being taken (1 for the first).
    """

    def __init__(self, w: Writer, layout: Layout, learning_rate: ir.Value, step: ir.Value) -> None:
        self.w, self.layout = w, layout
        self.group_of = layout.group_of
        # the scalars' type: double for torch's rounding, else float32 (no float64 in the graph)
        self._compute = compute_type(
            {"dtype": layout.dtype if layout.exact else None}, layout.dtype
        )
        lr = w.reshape(learning_rate, [])
        double = self._compute == np.float64
        self._lr = w.cast(lr, ir.DataType.DOUBLE) if double else lr
        self._step = w.cast(w.reshape(step, []), ir.DataType.from_numpy(self._compute))
        self._scalars: dict[int, Scalars] = {}

    def __call__(
        self,
        group: int,
        param: ir.Value,
        grad: ir.Value,
        states: Sequence[ir.Value],
        targets: Sequence[str | ir.Value],
    ) -> list[ir.Value]:
        """Write ``targets = (param, *states)`` after one step of group ``group``'s rule; return
        them.

        A state the group does not use passes through unchanged.
        """
        w, layout = self.w, self.layout
        spec = layout.groups[group]
        hyper = {**spec["hyper"], "dtype": layout.dtype if layout.exact else None}
        if group not in self._scalars:
            scale = float(spec["lr_scale"])
            lr = (
                self._lr
                if scale == 1.0
                else w.op("Mul", [self._lr, w.scalar(scale, self._compute)])
            )
            self._scalars[group] = layout.rule.scalars(w, hyper, lr, self._step, layout.dtype)
        by_slot = dict(zip(layout.states, states, strict=True))
        new_param, new_states = layout.rule.update(
            w, hyper, self._scalars[group], param, grad, by_slot
        )
        values = [w.op("Identity", [new_param], targets[0])]
        for slot, out in zip(layout.states, targets[1:], strict=True):
            values.append(w.op("Identity", [new_states.get(slot, by_slot[slot])], out))
        return values


def clip_by_group(
    layout: Layout,
    names: Sequence[str],
    grads: Sequence[ir.Value],
    clip: Callable[[list[ir.Value], float], list[ir.Value]],
) -> list[ir.Value]:
    """Clip each group's gradients by their joint L2 norm where the group has a ``max_norm``.

    Args:
        layout: The groups.
        names: Each gradient's parameter name.
        grads: The gradients.
        clip: Clips a list of gradients to a max norm (``clip_gradients``).
    """
    out = list(grads)
    for index, group in enumerate(layout.groups):
        if group.get("max_norm") is None:
            continue
        members = [i for i, n in enumerate(names) if layout.group_of.get(n, 0) == index]
        if members:
            for i, clipped in zip(
                members, clip([out[i] for i in members], float(group["max_norm"])), strict=True
            ):
                out[i] = clipped
    return out


def metadata(
    algorithm: str,
    groups: Sequence[Mapping[str, Any]],
    params: Sequence[tuple[str, int]],
    max_norm: float | None,
    exact: bool = True,
) -> str:
    """The JSON an optimizer model in standard ops carries: what :func:`parse_metadata` reads
    back.
    """
    plain = [
        {
            "hyper": dict(g["hyper"]),
            "lr_scale": g["lr_scale"],
            **({"max_norm": g["max_norm"]} if g.get("max_norm") else {}),
        }
        for g in groups
    ]
    return json.dumps(
        {
            "algorithm": algorithm,
            "groups": plain,
            "params": [list(p) for p in params],
            "max_norm": max_norm,
            **({} if exact else {"exact": False}),
        }
    )


def parse_metadata(
    text: str,
) -> tuple[str, tuple[dict[str, Any], ...], tuple[tuple[str, int], ...], float | None, bool]:
    """Read the optimizer metadata of a model in standard ops: algorithm, groups, parameters'
    groups, max norm, exact.

    Raises:
        PortabilityError: for metadata of another form.
    """
    try:
        data = json.loads(text)
        found = rule(str(data["algorithm"]))
        groups = tuple(
            {
                "hyper": {**found.defaults, **g["hyper"]},
                "lr_scale": float(g["lr_scale"]),
                **({"max_norm": float(g["max_norm"])} if g.get("max_norm") is not None else {}),
            }
            for g in data["groups"]
        )
        params = tuple((str(name), int(index)) for name, index in data["params"])
        max_norm = None if data.get("max_norm") is None else float(data["max_norm"])
        exact = data.get("exact", True)
    except (ValueError, KeyError, TypeError) as exc:
        raise PortabilityError(
            f"The optimizer model's optimizer metadata cannot be read ({exc}). Rebuild the "
            "optimizer model with "
            "onnxblocks.optim."
        ) from None
    if not isinstance(exact, bool):
        raise PortabilityError(
            f"The optimizer model's optimizer metadata has exact={exact!r:.40}, not true or "
            "false. Rebuild the "
            "optimizer model with onnxblocks.optim."
        )
    if not groups or any(not 0 <= i < len(groups) for _, i in params):
        raise PortabilityError(
            "The optimizer model's optimizer metadata names a parameter group that does not "
            "exist. Rebuild the "
            "optimizer model with onnxblocks.optim."
        )
    return found.name, groups, params, max_norm, exact


__all__ = ["GroupUpdater", "Layout", "metadata", "parse_metadata"]
