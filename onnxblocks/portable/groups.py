"""Parameter groups of an optimizer in standard ops: a rule applied per group, and the metadata that
records them.

A :class:`Layout` is what a layout (one tensor per parameter today, flattened
tensors later) needs to apply a rule of :mod:`onnxblocks.portable.rules`: the
groups' hyperparameters and learning-rate scales, each parameter's group, the state
slots and the element type. :class:`GroupUpdater` writes each group's scalars once
and the elementwise update per parameter or per flat buffer of a group's parameters
(``onnxblocks.portable.updates.update_parameters`` picks the layout). A default group is
one group like the others: every optimizer, the training build's kernels too, is applied here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.rules import Rule, Scalars, compute_type


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
        self._inputs = (learning_rate, step)
        self._lr_step: tuple[ir.Value, ir.Value] | None = None
        self._scalars: dict[int, Scalars] = {}

    def _lr_and_step(self) -> tuple[ir.Value, ir.Value]:
        """The learning rate and step as scalars of the compute type, written on first use."""
        if self._lr_step is None:
            w, (learning_rate, step) = self.w, self._inputs
            lr = w.reshape(learning_rate, [])
            if self._compute == np.float64:
                lr = w.cast(lr, ir.DataType.DOUBLE)
            self._lr_step = lr, w.cast(w.reshape(step, []), ir.DataType.from_numpy(self._compute))
        return self._lr_step

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
            lr, step = self._lr_and_step()
            if scale != 1.0:
                lr = w.op("Mul", [lr, w.scalar(scale, self._compute)])
            self._scalars[group] = layout.rule.scalars(w, hyper, lr, step, layout.dtype)
        by_slot = dict(zip(layout.states, states, strict=True))
        written = len(w.nodes)
        new_param, new_states = layout.rule.update(
            w, hyper, self._scalars[group], param, grad, by_slot
        )
        fresh = {id(v) for n in w.nodes[written:] for v in n.outputs}
        values = [new_param, *(new_states.get(slot, by_slot[slot]) for slot in layout.states)]
        out = []
        for value, target in zip(values, targets, strict=True):
            if isinstance(target, str) and id(value) in fresh:
                fresh.discard(id(value))  # written here: it takes the target's name, no copy
                value.name = target
                out.append(value)
            else:  # a state the group does not update passes through
                out.append(w.op("Identity", [value], target))
        return out


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


__all__ = ["GroupUpdater", "Layout", "clip_by_group"]
