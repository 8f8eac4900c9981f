"""``OptimizerSpec``: what an optimizer does, as one value.

An optimizer block of :mod:`onnxblocks.optim` produces it when it is built
(``block.optimizer_spec``); the training build's optimizer model, the portable optimizer
models (:mod:`onnxblocks.portable.optimizer`) and the fused step model
(:mod:`onnxblocks.portable.step`) are written from it. Its parts are data:

* ``kind``: the algorithm, a rule of :mod:`onnxblocks.portable.rules`;
* ``form``: ``"standard"`` (the update in standard ops, torch's arithmetic) or
  ``"onnxruntime"`` (the training build's ``AdamWOptimizer`` / ``SGDOptimizerV2`` op, whose
  arithmetic :data:`~onnxblocks.portable.rules.KERNEL_RULES` writes for portable artifacts);
* ``groups``: the parameter groups, the default group first (an optimizer without groups has
  that one): each its hyperparameters, ``lr_scale`` (its learning rate over the session's) and
  optional ``max_norm``;
* ``params``: the trainable parameters in the optimizer model's order, each with its group.

An optimizer model in standard ops carries the spec as JSON in its metadata
(``onnxblocks.optimizer``: :meth:`OptimizerSpec.to_json`, :meth:`OptimizerSpec.from_json`);
reading an optimizer model back (artifacts on disk) is
:func:`onnxblocks.portable.optimizer.read_optimizer`'s job alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx
from onnx import helper

from onnxblocks._core.contracts import STATE_SEQUENCES
from onnxblocks._core.errors import PortabilityError
from onnxblocks.portable import groups as _groups
from onnxblocks.portable import rules as _rules

#: How the training build runs the update: standard ops, or ONNX Runtime's own op.
OptimizerForm = Literal["standard", "onnxruntime"]


@dataclass(frozen=True)
class OptimizerSpec:
    """What an optimizer model does (see the module docs).

    Attributes:
        kind: The algorithm (``"adamw"``, ``"sgd"``, ``"adam"``, ...).
        groups: Each parameter group's ``{"hyper": ..., "lr_scale": ..., "max_norm": ...}``, the
            default group first; the hyperparameters have the rule's defaults filled in.
        params: The trainable parameters in the optimizer model's order, each with its group's
            index (empty when only their count is known: an old training-build model).
        max_norm: The global gradient-clipping norm, or None without clipping.
        elem_type: The parameters' element type.
        exact: Round as torch's CPU kernels do (see :mod:`~onnxblocks.portable.rules`).
        form: ``"standard"`` or ``"onnxruntime"``.
    """

    kind: str
    groups: tuple[Mapping[str, Any], ...]
    params: tuple[tuple[str, int], ...] = ()
    max_norm: float | None = None
    elem_type: int = onnx.TensorProto.FLOAT
    exact: bool = True
    form: OptimizerForm = "standard"

    @classmethod
    def kernel(
        cls,
        kind: str,
        attributes: Mapping[str, Any],
        max_norm: float | None = None,
        elem_type: int = onnx.TensorProto.FLOAT,
        params: Sequence[str] = (),
    ) -> OptimizerSpec:
        """The spec of ONNX Runtime's ``AdamWOptimizer`` (``kind="adamw"``, its attributes) or
        ``SGDOptimizerV2`` (``"sgd"``): one group, the kernel's float32 arithmetic.
        """
        rule = _rules.KERNEL_RULES[kind]
        group = {"hyper": {**rule.defaults, **attributes}, "lr_scale": 1.0}
        order = tuple((name, 0) for name in params)
        return cls(kind, (group,), order, max_norm, elem_type, False, "onnxruntime")

    @property
    def rule(self) -> _rules.Rule:
        """The update rule: torch's arithmetic, or the training build's kernel."""
        if self.form == "onnxruntime":
            return _rules.KERNEL_RULES[self.kind]
        return _rules.rule(self.kind)

    @property
    def attributes(self) -> dict[str, Any]:
        """The default group's hyperparameters (of ``AdamWOptimizer``: its attributes)."""
        return dict(self.groups[0]["hyper"])

    @property
    def states(self) -> tuple[str, ...]:
        """The state tensors per parameter (torch's names), in slot order."""
        return self.rule.states([g["hyper"] for g in self.groups])

    @property
    def updated_states(self) -> int:
        """How many state tensors per parameter the update writes."""
        return len(self.states)

    @property
    def state_inputs(self) -> tuple[str, ...]:
        """The state sequences the training build's optimizer model reads."""
        return STATE_SEQUENCES[: max(len(self.states), self.rule.state_inputs)]

    @property
    def moments(self) -> int:
        """How many moments per parameter the optimizer keeps (ONNX Runtime's SGD: one of
        zeros).
        """
        return len(self.state_inputs)

    @property
    def dtype(self) -> np.dtype:
        """The parameters' numpy element type."""
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))

    def layout(self) -> _groups.Layout:
        """The rule, groups and state slots a layout applies
        (:class:`~onnxblocks.portable.groups.GroupUpdater`).
        """
        return _groups.Layout(
            self.rule, self.groups, dict(self.params), self.states, self.dtype, self.exact
        )

    def to_json(self) -> str:
        """The metadata an optimizer model in standard ops carries (``onnxblocks.optimizer``)."""
        plain = [
            {
                "hyper": dict(g["hyper"]),
                "lr_scale": g["lr_scale"],
                **({"max_norm": g["max_norm"]} if g.get("max_norm") else {}),
            }
            for g in self.groups
        ]
        return json.dumps(
            {
                "algorithm": self.kind,
                "groups": plain,
                "params": [list(p) for p in self.params],
                "max_norm": self.max_norm,
                **({} if self.exact else {"exact": False}),
            }
        )

    @classmethod
    def from_json(cls, text: str, elem_type: int = onnx.TensorProto.FLOAT) -> OptimizerSpec:
        """The spec :meth:`to_json` wrote.

        Raises:
            PortabilityError: for metadata of another form.
        """
        try:
            data = json.loads(text)
            found = _rules.rule(str(data["algorithm"]))
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
                "optimizer model with onnxblocks.optim."
            ) from None
        if not isinstance(exact, bool):
            raise PortabilityError(
                f"The optimizer model's optimizer metadata has exact={exact!r:.40}, not true or "
                "false. Rebuild the optimizer model with onnxblocks.optim."
            )
        if not groups or any(not 0 <= i < len(groups) for _, i in params):
            raise PortabilityError(
                "The optimizer model's optimizer metadata names a parameter group that does not "
                "exist. Rebuild the optimizer model with onnxblocks.optim."
            )
        return cls(found.name, groups, params, max_norm, elem_type, exact)


__all__ = ["OptimizerForm", "OptimizerSpec"]
