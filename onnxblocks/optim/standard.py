"""Optimizers written in standard ops: the torch.optim family, with parameter groups.

:class:`StandardOptimizer` builds an optimizer model whose update is a rule of
:mod:`onnxblocks.portable.rules` (SGD with momentum, Adam, AdamW with amsgrad,
Adagrad, RMSprop) written with standard ONNX ops over ONNX Runtime's optimizer
inputs (``learning_rate``, ``step``, ``params``, ``gradients`` and one state
sequence per state tensor the algorithm keeps), returning the updated sequences.
Its :class:`~onnxblocks.portable.optimizer_spec.OptimizerSpec` (the algorithm, its groups and
hyperparameters) is what the portable optimizer and fused step models are written from; the
model carries it in its metadata (``onnxblocks.optimizer``) for the runtime and for later reads.

Parameter groups are spelled as in torch, naming parameters instead of passing
tensors: ``param_groups=[{"params": ["fc1.bias"], "weight_decay": 0.0}]``, or a
predicate over names (``{"params": lambda name: name.endswith("bias"), ...}``).
Parameters no group takes are in the default group (the optimizer's own
hyperparameters). A group's ``"lr"`` is absolute, as in torch (its ratio to the
optimizer's ``lr`` is kept); ``"lr_scale"`` gives the ratio directly. The
session's (or a scheduler's) learning rate replaces the optimizer's ``lr`` at
run time, and each group keeps its ratio to it, as torch's ``LambdaLR`` scales
every group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import GRADIENTS, LEARNING_RATE, OPTIMIZER_METADATA, PARAMS, STEP
from onnxblocks._core.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnknownNameError,
    did_you_mean,
)
from onnxblocks.blocks.value import Value
from onnxblocks.optim.base import Optimizer, parameter_elem_type, sequence_input, spec_type
from onnxblocks.optim.clip import ClipGradNorm, check_max_norm
from onnxblocks.optim.param_groups import (
    GroupParams,
    NormBiasParams,
    check_hyper,
    flag,
    no_decay_norm_bias,
    rule,
)

if TYPE_CHECKING:
    from onnxblocks.portable.optimizer_spec import OptimizerSpec


class StandardOptimizer(Optimizer):
    """An optimizer of the torch.optim family in standard ops, with parameter groups (see the module
    docs).

    Args:
        algorithm: A rule of :mod:`onnxblocks.portable.rules` (``"sgd"``, ``"adam"``, ...).
        hyper: The default group's hyperparameters (the rule's defaults fill the rest).
        lr: The default group's learning rate, to which groups' absolute ``lr`` are relative.
        param_groups: Parameter groups, each a dict with ``"params"`` (names or a name predicate),
            optionally ``"lr"`` or ``"lr_scale"``, ``"max_grad_norm"`` (clip this group's gradients
            by
            their joint L2 norm, after the global ``clip_grad``), and hyperparameters of the
            algorithm.
        clip_grad: Clip the gradients' global L2 norm first.
        owner: The class name errors and ``repr`` give (default: this class's).
        exact: Round as torch's CPU kernels do (fused multiply-adds and square roots in double, so
        the
            numbers are torch's to the last bit or so); False writes them in float32 (about 2x fewer
            passes
            over memory, an ulp apart per step: ``benchmarks/bench_optim_rules.py``).

    Raises:
        UnknownNameError, InvalidTypeError, InvalidValueError: for bad hyperparameters or groups.
    """

    def __init__(
        self,
        algorithm: str,
        hyper: Mapping[str, Any],
        lr: float,
        param_groups: Sequence[Mapping[str, Any]] | None = None,
        clip_grad: ClipGradNorm | float | None = None,
        owner: str | None = None,
        exact: bool = True,
    ) -> None:
        super().__init__(clip_grad)
        self.exact = flag(exact, f"{owner or type(self).__name__} exact")
        self.algorithm = algorithm
        self._owner = name = owner or type(self).__name__
        self.lr = _hyper.learning_rate(lr, f"{name} lr")
        if self.lr == 0:
            raise InvalidValueError(
                f"{name} lr must be > 0: groups' learning rates are kept as ratios to it."
            )
        self.hyper = check_hyper(algorithm, hyper, name)
        self.param_groups = [self._check_group(i, g) for i, g in enumerate(param_groups or ())]

    def _check_group(self, index: int, group: Any) -> dict[str, Any]:
        where = f"{self._owner} param_groups[{index}]"
        if not isinstance(group, Mapping) or "params" not in group:
            raise InvalidTypeError(
                f"{where} must be a dict with 'params' (names or a predicate), got {group!r:.80}."
            )
        params = group["params"]
        if isinstance(params, str) or not (callable(params) or isinstance(params, Sequence)):
            raise InvalidTypeError(
                f"{where}['params'] must be a list of parameter names or a predicate over names, "
                "not "
                f"{type(params).__name__} {params!r:.60}."
            )
        if not callable(params) and not all(isinstance(p, str) for p in params):
            raise InvalidTypeError(f"{where}['params'] must hold parameter names (str).")
        if "lr" in group and "lr_scale" in group:
            raise InvalidValueError(f"{where} gives both 'lr' and 'lr_scale'; give one.")
        if "lr" in group:
            scale = _hyper.learning_rate(group["lr"], f"{where} lr") / self.lr
        else:
            scale = _hyper.nonnegative(group.get("lr_scale", 1.0), f"{where} lr_scale")
        own = ("params", "lr", "lr_scale", "max_grad_norm")
        hyper = check_hyper(self.algorithm, {k: v for k, v in group.items() if k not in own}, where)
        max_norm = (
            check_max_norm(group["max_grad_norm"])
            if group.get("max_grad_norm") is not None
            else None
        )
        chosen = params if callable(params) else list(params)
        return {"params": chosen, "lr_scale": scale, "hyper": hyper, "max_norm": max_norm}

    def spec(self, trainable: Sequence[Any], elem_type: int) -> OptimizerSpec:
        """The optimizer for these trainable parameters: each one's group resolved.

        Raises:
            UnknownNameError: for a group naming a parameter that is not trainable.
            InvalidValueError: for a parameter two groups name.
        """
        names = [p.name for p in trainable]
        shapes = {p.name: tuple(getattr(p, "dims", getattr(p, "shape", ()))) for p in trainable}
        known = set(names)
        owner: dict[str, int] = {}
        for index, group in enumerate(self.param_groups, start=1):
            chosen = group["params"]
            if callable(chosen):
                takes = [
                    n
                    for n in names
                    if n not in owner
                    and (chosen(n, shapes[n]) if isinstance(chosen, NormBiasParams) else chosen(n))
                ]
            else:
                for n in chosen:
                    if n not in known:
                        raise UnknownNameError(
                            f"{self._owner} param_groups[{index - 1}] names '{n}', which is not "
                            "a trainable "
                            f"parameter.{did_you_mean(n, names)}"
                        )
                    if n in owner:
                        raise InvalidValueError(
                            f"'{n}' is in param_groups[{owner[n] - 1}] and "
                            f"param_groups[{index - 1}]; a parameter "
                            "belongs to one group (as in torch)."
                        )
                takes = list(chosen)
            owner.update(dict.fromkeys(takes, index))
        defaults = rule(self.algorithm).defaults
        groups = [{"hyper": {**defaults, **self.hyper}, "lr_scale": 1.0}]
        groups += [
            {
                "hyper": {**defaults, **self.hyper, **g["hyper"]},
                "lr_scale": g["lr_scale"],
                "max_norm": g["max_norm"],
            }
            for g in self.param_groups
        ]
        params = tuple((n, owner.get(n, 0)) for n in names)
        return spec_type()(
            self.algorithm, tuple(groups), params, self.max_norm, elem_type, self.exact
        )

    def build(self, parameters: Any) -> list[Value]:  # type: ignore[override]
        """Declare the optimizer inputs and write the update in standard ops; return the updated
        sequences.

        Args:
            parameters: ``(trainable, frozen)``, as for :class:`~onnxblocks.optim.base.Optimizer`.
        """
        acc = self.accessor
        elem_type = parameter_elem_type(parameters)
        trainable = list(parameters[0])
        spec = self.spec(trainable, elem_type)
        self._spec_inputs = (tuple(trainable), elem_type)
        acc.add_input(LEARNING_RATE, onnx.TensorProto.FLOAT, [1])
        acc.add_input(STEP, onnx.TensorProto.INT64, [1])
        for name in (PARAMS, GRADIENTS, *spec.state_inputs):
            sequence_input(acc, name, elem_type)
        meta = acc.metadata_props
        meta[OPTIMIZER_METADATA] = spec.to_json()
        from onnxblocks.portable.optimizer import portable_optimizer_model

        opset = acc.domain_version("") or _limits.DEFAULT_ONNX_OPSET
        model = portable_optimizer_model(spec, len(trainable), opset)
        onnx.helper.set_model_props(model, meta)
        acc.replace_model(model)
        return [Value(o.name) for o in model.graph.output]

    def update(
        self,
        learning_rate: Value,
        step: Value,
        params: Value,
        gradients: Value,
        states: list[Value],
    ) -> Value:
        """Not used: :meth:`build` writes the whole model."""
        raise NotImplementedError

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={v!r}" for k, v in self.hyper.items())
        groups = f", param_groups={self.param_groups!r}" if self.param_groups else ""
        clip = f", clip_grad={self.clip_grad!r}" if self.clip_grad is not None else ""
        return f"{self._owner}(lr={self.lr!r}{', ' + hyper if hyper else ''}{groups}{clip})"


__all__ = [
    "GroupParams",
    "NormBiasParams",
    "StandardOptimizer",
    "check_hyper",
    "no_decay_norm_bias",
    "rule",
]
