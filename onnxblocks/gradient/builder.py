"""Build the training and eval models by delegating autodiff to ONNX Runtime.

ONNX Runtime's native gradient builder (``GradientGraphBuilder`` in
``onnxruntime.capi._pybind_state``) differentiates the forward graph. This module
orchestrates the steps that prepare the forward graph for it and turn its result
into the models ONNX Runtime's training API runs:

1. The model is checked where it enters (:mod:`onnxblocks.gradient.intake`: an
   opset import, nodes in topological order, an opset above 21 converted down),
   and a model below opset 11 is converted to opset 13 (:func:`upgrade_old_opset`).
2. The normalisation passes (:mod:`onnxblocks.gradient.rewrites`) rewrite
   patterns the gradient builder cannot handle.
3. Trainable and frozen parameters become graph inputs, after the user inputs
   (:mod:`onnxblocks.gradient.signature`, as are the other changes of inputs and outputs).
4. The eval model is this forward graph with training-mode ops switched off
   (:mod:`onnxblocks.gradient.eval_model`).
5. LayerNormalization scales and biases are lifted
   (:func:`~onnxblocks.gradient.layer_norm.unshare_norm_constants`), values without a
   gradient that several nodes read get an input per reader
   (:mod:`onnxblocks.gradient.frozen_reads`), and held
   (large) initializers that are *not* parameters, whose bytes onnxblocks never
   copies, become temporary graph inputs for ONNX Runtime; they are turned back
   into held stubs afterwards.
6. ``get_optimized_model`` runs ONNX Runtime's pre-training transformers and
   ``GradientGraphBuilder`` adds the gradient graph (:mod:`onnxblocks.gradient.ort_bridge`).
   Before, a ``Pow`` whose exponent needs a gradient is rewritten so that ONNX
   Runtime differentiates it (:mod:`onnxblocks.gradient.power`), and what its
   gradient builder would abort on or misreport (control flow over parameters, a
   constant loss) is refused (:mod:`onnxblocks.gradient.dependencies`).
7. ONNX Runtime's result becomes one ``ir.Model``: the aliases and the held constants are
   restored, inputs and outputs put in the documented order, the gradients accumulated
   (:mod:`onnxblocks.gradient.accumulation`) and the chosen segments recomputed
   (:mod:`onnxblocks.gradient.recompute`) on it; it goes back to protobuf once, and a CPU
   session checks that every node of the training model has a kernel.

No weight bytes are serialized on the way: parameters are inputs and held
constants are inputs while ONNX Runtime works.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.validation import check_skeleton
from onnxblocks.gradient import (
    accumulation,
    dependencies,
    eval_model,
    kernels,
    ort_bridge,
    pooling,
    signature,
)
from onnxblocks.gradient.batch_norm import private_running_statistics
from onnxblocks.gradient.frozen_reads import (
    FrozenReads,
    alias_frozen_reads,
    restore_frozen_reads,
)
from onnxblocks.gradient.intake import check_ranks, fit_model, graph_is_sorted
from onnxblocks.gradient.layer_norm import unshare_norm_constants
from onnxblocks.gradient.parameters import (
    ParameterPartition,
    check_requires_grad_read,
    partition_parameters,
)
from onnxblocks.gradient.power import PowExponentAsExpLog
from onnxblocks.gradient.recompute import recompute_training_model
from onnxblocks.gradient.rewrites import normalize
from onnxblocks.gradient.stop_gradient import StoppedGradients, cut_stopped, restore_stopped
from onnxblocks.ir.opset import convert_opset
from onnxblocks.ir.proto import copy_model
from onnxblocks.ir.rewrite import run_pass
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.types import elem_type, forget_inferred, infer_proto_types, shape, type_proto

__all__ = [
    "MIN_GRADIENT_OPSET",
    "UPGRADE_OPSET",
    "TrainingGraphs",
    "build_training_graphs",
    "check_training_model",
    "upgrade_old_opset",
]


@dataclass
class TrainingGraphs:
    """The result of :func:`build_training_graphs`.

    Both models may hold stubs for large constants (see
    :mod:`onnxblocks._core.weights`); materialize them with the build's
    accessor, or save them with ``onnxblocks.io.save_model(..., weights=store)``.

    Attributes:
        training: The training model (forward, loss, gradient and accumulation).
        eval: The eval model (forward and loss, training-mode ops off).
        partition: Which parameters are trainable or frozen, in input order.
        user_outputs: The outputs of the forward graph (loss first), in order.
        user_inputs: The inputs of the forward graph, in order.
        rewrites: How many nodes each normalisation pass rewrote.
        training_ir: The IR ``training`` was serialized from, for the pass that edits the training
            model next (it clones this rather than convert ``training`` back); None when
            ``training`` came otherwise.
    """

    training: onnx.ModelProto
    eval: onnx.ModelProto
    partition: ParameterPartition
    user_outputs: tuple[str, ...]
    user_inputs: tuple[str, ...]
    rewrites: dict[str, int] = field(default_factory=dict)
    training_ir: ir.Model | None = field(default=None, repr=False, compare=False)


def build_training_graphs(
    model: onnx.ModelProto | ir.Model,
    requires_grad: Iterable[str],
    frozen_params: Iterable[str] = (),
    outputs: Sequence[str] | None = None,
    custom_op_libraries: Sequence[str] = (),
    *,
    recompute: str | int | tuple[str, ...] = "none",
    scopes: Mapping[str, str] | None = None,
) -> TrainingGraphs:
    """Build the training and eval models of a forward model whose first output is the loss.

    Args:
        model: The forward model (not mutated): a build's ``ir.Model`` (cloned, not converted)
            or a ``ModelProto`` (converted once). Its large initializers may be held stubs.
        requires_grad: Parameters to train and graph inputs whose gradient is wanted.
        frozen_params: Parameters fed from the checkpoint without a gradient.
        outputs: The user outputs, loss first; defaults to the model's graph outputs.
        custom_op_libraries: Shared libraries with custom ops, registered with ONNX Runtime.
        recompute: A checked recomputation policy
            (:func:`~onnxblocks.gradient.recompute.recompute_training_model`), applied to the
            training model before it is checked.
        scopes: The forward nodes' module paths, for ``recompute``.

    Returns:
        The training and eval models and the parameter partition.

    Raises:
        UnknownNameError: for an unknown parameter or output name.
        ValueError: for a parameter both trainable and frozen, or a loss that is not a scalar.
        TypeError: for a non-float trainable parameter or loss.
        GradientError: when ONNX Runtime cannot differentiate the graph.
    """
    ir_forward = forward_ir(model)
    graph = ir_forward.graph
    user_outputs = signature.select_outputs(graph, outputs)
    partition = partition_parameters(graph, requires_grad, frozen_params)
    param_types = {
        name: (elem_type(v) or 0, [int(d or 0) for d in shape(v) or ()])
        for name, v in graph.initializers.items()
    }
    accumulation.check_accumulable([(p, param_types[p][0]) for p in partition.trainable])
    rewrites = normalize(ir_forward)
    signature.check_loss(_loss_types(model, user_outputs[0]), user_outputs[0])

    signature.keep_only_outputs(graph, user_outputs)
    check_requires_grad_read(graph, partition)
    signature.parameters_to_inputs(graph, partition.parameters)
    user_inputs = tuple(
        v.name or "" for v in graph.inputs if v.name not in set(partition.parameters)
    )
    signature.warn_gradient_like_names(user_inputs, user_outputs)

    evaluation = _eval_model(ir_forward)

    forward_inputs = {v.name or "": ir.serde.serialize_value(v) for v in graph.inputs}
    # the training copy's last edits: the Pow rewrite, the checks, unshared norm constants
    pow_changes = run_pass(PowExponentAsExpLog(partition.requires_grad), ir_forward)
    rewrites[PowExponentAsExpLog.name] = sum(pow_changes.values())
    stopped = cut_stopped(ir_forward, partition.requires_grad)
    dependencies.check_differentiable(ir_forward.graph, partition.requires_grad, user_outputs[0])
    norm_constants, _ = unshare_norm_constants(ir_forward.graph)
    frozen_reads = alias_frozen_reads(ir_forward.graph, partition.requires_grad, partition.frozen)
    forward = to_proto(ir_forward, initializer_types=False)  # ONNX Runtime's builder's door
    del ir_forward, graph  # freed before ONNX Runtime's builder, the step that needs memory
    held = signature.held_constants_to_inputs(forward, also=norm_constants | frozen_reads.lifted)
    training, seed = ort_bridge.differentiate(
        forward, partition, user_outputs[0], custom_op_libraries
    )
    pooling.check_pool_shapes(forward, training)
    # ONNX Runtime's result becomes one IR, edited until it goes back to protobuf once below
    ir_training = from_proto(training)
    seeded = seed if seed != user_outputs[0] else None
    _restore(ir_training, frozen_reads, stopped, {t.name for t in held}, seeded)
    signature.restore_held_constants(ir_training.graph, held)
    signature.order_inputs_and_outputs(
        ir_training.graph, forward_inputs, user_inputs, partition, user_outputs
    )
    accumulation.add_gradient_accumulation(
        ir_training, [(p, *param_types[p]) for p in partition.trainable]
    )
    # on the finished gradient graph: any execution order holds it
    recompute_training_model(ir_training, recompute, user_outputs, scopes)
    training = _limits.stamp_versions(to_proto(ir_training))
    ir_training.ir_version = training.ir_version  # the IR stays the model written
    kernels.check_kernels(training, forward, custom_op_libraries)
    return TrainingGraphs(
        training,
        evaluation,
        partition,
        user_outputs,
        user_inputs,
        rewrites,
        ir_training,
    )


def _restore(
    training: ir.Model,
    frozen_reads: FrozenReads,
    stopped: StoppedGradients,
    held: set[str],
    seed: str | None = None,
) -> None:
    """ONNX Runtime's result without the float32 seed output ``seed``, with the aliases read as
    their values again and private batch-norm statistics, on its IR.

    ``held`` names the constants that are graph inputs while ONNX Runtime builds (restored
    afterwards by :func:`~onnxblocks.gradient.signature.restore_held_constants`).
    """
    if seed:
        signature.drop_float_seed(training.graph, seed)
    restore_frozen_reads(training.graph, frozen_reads)
    restore_stopped(training.graph, stopped)
    private_running_statistics(training, held)


#: Models below this ai.onnx opset are converted to :data:`UPGRADE_OPSET` first: ONNX Runtime's
#: gradient
#: builders emit ops in forms that need it (a Gemm without C, opset 11).
MIN_GRADIENT_OPSET = 11
UPGRADE_OPSET = 13


def _eval_model(forward: ir.Model) -> onnx.ModelProto:
    """The eval model: ``forward`` with training-mode ops off, on a clone dropped once written."""
    evaluation = forward.clone()
    normalize(evaluation, [eval_model.DisableTrainingMode()])
    return _limits.stamp_versions(to_proto(evaluation, initializer_types=False))


def _loss_types(model: onnx.ModelProto | ir.Model, loss: str) -> dict[str, onnx.TypeProto]:
    """The loss's type: as the build typed it (its node checked on its own), else inferred over
    the model (onnx's inference takes protobuf).
    """
    if isinstance(model, ir.Model):
        value = next((v for v in model.graph.outputs if v.name == loss), None)
        known = None if value is None else type_proto(value)
        if known is not None and known.tensor_type.HasField("shape"):
            return {loss: known}
        model = to_proto(model, initializer_types=False)
    return infer_proto_types(model)


def forward_ir(model: onnx.ModelProto | ir.Model) -> ir.Model:
    """The working IR of a forward model: a clone of a build's IR that needs no fitting, else the
    model fitted (:func:`~onnxblocks.gradient.intake.fit_model`, :func:`upgrade_old_opset`) and
    converted once.
    """
    if isinstance(model, ir.Model):
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        fits = opset is not None and MIN_GRADIENT_OPSET <= opset <= _limits.MAX_ONNX_OPSET
        if fits and graph_is_sorted(model.graph):
            clone = model.clone()
            forget_inferred(clone)  # the build's per-node types are not the graph's declarations
            return clone
        model = to_proto(model)
    else:
        model = copy_model(model)
    return from_proto(upgrade_old_opset(fit_model(model, "the model")))


def upgrade_old_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert a model below opset 11 to opset 13 with onnx's version converter (the eval model is
    converted too).

    Returns:
        ``model`` itself at opset 11 or newer, else a converted copy.

    Raises:
        ValueError: when onnx's version converter cannot convert the model.
    """
    opset = _limits.onnx_opset(model)
    if opset is None or opset >= MIN_GRADIENT_OPSET:
        return model
    return convert_opset(
        model, UPGRADE_OPSET, "the model (ONNX Runtime's gradient builders need opset 11)"
    )


def check_training_model(model: onnx.ModelProto, what: str = "the training model") -> None:
    """Run onnx's checker once on a training or eval model's skeleton (no weight bytes read).

    ONNX Runtime's gradient ops that live in the default domain (``MaxPoolGrad``
    ...) are unknown to onnx; they are checked as contrib ops, i.e. structurally.

    Raises:
        ValueError: naming graph inputs or outputs whose rank is unknown.
        onnx.checker.ValidationError: if the model is invalid.
    """
    check_ranks(model, what)
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)  # callers pass models whose large weights are stubs
    opset = _limits.onnx_opset(skeleton) or _limits.DEFAULT_ONNX_OPSET
    relabelled = False
    for node in skeleton.graph.node:
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            node.domain = _limits.MS_DOMAIN
            relabelled = True
        elif node.domain in ("", "ai.onnx"):
            try:
                onnx.defs.get_schema(node.op_type, opset, "")
            except onnx.defs.SchemaError:
                node.domain = _limits.MS_DOMAIN
                relabelled = True
    if relabelled:
        _limits.ensure_opset(skeleton, _limits.MS_DOMAIN, _limits.MS_OPSET)
    check_skeleton(skeleton)
