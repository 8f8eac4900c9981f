"""``make_portable``: the portable training, optimizer and fused step models from the training
build's ones.

The entry point of the graph side of portable artifacts (docs/portable.md): it
never changes its arguments, and checks that what it returns holds only ops
stock ONNX Runtime runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import PORTABLE_METADATA, PORTABLE_MODE_METADATA
from onnxblocks._core.errors import InvalidTypeError, PortabilityError, preview
from onnxblocks.ir.passes import run_passes
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.portable.accumulation import AccumulateGradients
from onnxblocks.portable.float64 import FoldFloat64Constants
from onnxblocks.portable.lower import LowerTrainingOps
from onnxblocks.portable.ops import PortableMode, non_portable_ops, portable_mode
from onnxblocks.portable.optimizer import optimizer_ir, read_optimizer
from onnxblocks.portable.optimizer_spec import OptimizerSpec
from onnxblocks.portable.step import FuseStep


@dataclass(frozen=True)
class PortableModels:
    """What :func:`make_portable` returns.

    Attributes:
        training: The training model: standard ops, accumulated gradients as outputs.
        optimizer: The optimizer model (one tensor in and out per parameter and moment), or None
        without one.
        step: The fused step model, or None (no optimizer, or ``fused_step=False``).
        trainable: The trainable parameters, in the training model's order.
        lowered: How many nodes of each training-only op were lowered.
        mode: The portable mode: ``"standard"`` (standard ONNX ops only) or ``"onnxruntime"``.
    """

    training: onnx.ModelProto
    optimizer: onnx.ModelProto | None
    step: onnx.ModelProto | None
    trainable: tuple[str, ...]
    lowered: dict[str, int] = field(default_factory=dict)
    mode: PortableMode = "standard"


def make_portable(
    training_model: onnx.ModelProto | ir.Model,
    optimizer_model: onnx.ModelProto | None = None,
    *,
    fused_step: bool = True,
    frozen_params: Sequence[str] | None = None,
    mode: PortableMode | bool = "standard",
    optimizer_spec: OptimizerSpec | None = None,
    edit_in_place: bool = False,
) -> PortableModels:
    """Rewrite a training model (and its optimizer model) into models stock ONNX Runtime trains.

    Example:
        >>> models = make_portable(
        ...     onnx.load("training_model.onnx"), onnx.load("optimizer_model.onnx"))
        >>> onnx.save(models.step, "step_model.onnx")

    Args:
        training_model: A training model from :func:`onnxblocks.generate_artifacts` (its
            large initializers may be held stubs; they are kept as they are), or its IR (the
            gradient builder's ``TrainingGraphs.training_ir``: cloned, not converted).
        optimizer_model: Its optimizer model (:mod:`onnxblocks.optim`), or None.
        fused_step: Also build the fused step model (needs ``optimizer_model``).
        frozen_params: The frozen parameters (the step model's last inputs); default:
            read from the training model's input order.
        mode: ``"standard"`` (default; ``True`` too): standard ONNX ops only, which any ONNX
            runtime runs; ``"onnxruntime"``: also keep the ``com.microsoft`` ops stock ONNX Runtime
            runs on CPU (``Gelu``, ``FusedMatMul``, ...; docs/portable.md measures what it gains).
        optimizer_spec: What ``optimizer_model`` does, as its optimizer block produced it
            (``block.optimizer_spec``); default: read back from ``optimizer_model``
            (:func:`~onnxblocks.portable.optimizer.read_optimizer`).
        edit_in_place: With an IR ``training_model``: lower that IR itself instead of a clone
            (a caller that gives the IR up, as ``generate_artifacts`` does, saves the clone).

    Returns:
        The :class:`PortableModels`, each with ``onnxblocks.portable = "1"`` and
        ``onnxblocks.portable.mode = mode`` in its metadata.

    Raises:
        PortabilityError: for an op without a standard-op lowering (naming it and its node),
            or an optimizer model of another form than onnxblocks' own.
        InvalidValueError: for an unknown ``mode``.
    """
    if not isinstance(training_model, (onnx.ModelProto, ir.Model)):
        raise InvalidTypeError(
            "training_model must be an onnx.ModelProto or an onnx_ir.Model, not "
            f"{type(training_model).__name__}."
        )
    if optimizer_model is not None and not isinstance(optimizer_model, onnx.ModelProto):
        raise InvalidTypeError(
            "optimizer_model must be an onnx.ModelProto or None, not "
            f"{type(optimizer_model).__name__}."
        )
    checked = portable_mode(mode, "mode")
    spec = optimizer_spec
    if spec is None and optimizer_model is not None:  # a model from disk or another tool
        spec = read_optimizer(optimizer_model)
    # not changed (unless edit_in_place): the IR shares its tensors, and the passes edit the IR
    if isinstance(training_model, onnx.ModelProto):
        training = from_proto(training_model)
    else:
        training = training_model if edit_in_place else training_model.clone()
    lowering = LowerTrainingOps(checked)
    counts = dict(run_passes(training, [lowering, FoldFloat64Constants()])[lowering.name])
    step = None
    if spec is not None and fused_step:
        fused = training.clone()
        FuseStep(spec, frozen_params)(fused)
        step = _finish(fused, "step", checked)
    accumulation = AccumulateGradients()
    accumulation(training)
    trainable = accumulation.trainable
    optimizer = None
    if optimizer_model is not None and spec is not None:
        by_name = {v.name: v for v in training.graph.inputs}
        opset = max(_limits.onnx_opset(optimizer_model) or _limits.DEFAULT_ONNX_OPSET, 13)
        written = optimizer_ir(spec, [by_name[p] for p in trainable], opset)
        optimizer = _finish(written, "optimizer", checked)
    lowered = _finish(training, "training", checked, stamp=False)
    return PortableModels(lowered, optimizer, step, tuple(trainable), counts, checked)


def portable_eval_model(
    eval_model: onnx.ModelProto | ir.Model, mode: PortableMode | bool = "standard"
) -> onnx.ModelProto:
    """The eval model with the ops a portable model of ``mode`` may not hold lowered, checked and
    marked.

    ONNX Runtime's fusions may have written contrib ops into the forward graph (``Gelu``,
    ``FusedMatMul``...), and exporters float64 arithmetic of constants, which builds without
    float64 kernels cannot place (:mod:`onnxblocks.portable.float64`). A ``ModelProto`` is
    not changed; an ``ir.Model`` is lowered in place.

    Raises:
        PortabilityError: for an op without a standard-op lowering.
        InvalidValueError: for an unknown ``mode``.
    """
    checked = portable_mode(mode, "mode")
    model = eval_model if isinstance(eval_model, ir.Model) else from_proto(eval_model)
    run_passes(model, [LowerTrainingOps(checked), FoldFloat64Constants()])
    return _finish(model, "eval", checked, stamp=False)


def _finish(model: ir.Model, what: str, mode: PortableMode, stamp: bool = True) -> onnx.ModelProto:
    """Check ``model`` is portable, mark it so, and serialize it (with the IR version set when
    ``stamp``).
    """
    check_portable(model, f"the portable {what} model", mode)
    model.metadata_props[PORTABLE_METADATA] = "1"
    model.metadata_props[PORTABLE_MODE_METADATA] = mode
    proto = to_proto(model)
    if stamp:
        _limits.stamp_versions(proto)
    return proto


def check_portable(
    model: onnx.ModelProto | ir.Model,
    what: str = "the model",
    mode: PortableMode | bool = "standard",
) -> None:
    """Raise :class:`PortabilityError` when ``model`` holds ops a portable model of ``mode`` may not
    hold.

    Raises:
        PortabilityError: naming the ops and the first node.
        InvalidValueError: for an unknown ``mode``.
    """
    found = non_portable_ops(model, mode)
    if found:
        node = found[0][0]
        ops = sorted({f"{domain}:{op}" for _, op, domain in found})
        runs = (
            "stock ONNX Runtime cannot run"
            if portable_mode(mode) == "onnxruntime"
            else "are not standard ONNX"
        )
        raise PortabilityError(
            f"{what} holds ops that {runs}: {preview(ops)} (first: node '{node.name}'). "
            "Generate non-portable artifacts (portable=False) for onnxruntime-training, or "
            "rewrite that part of "
            "the model."
        )
