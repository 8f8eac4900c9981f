"""Graph normalisation passes that run before ONNX Runtime builds the gradient.

Each pass rewrites a pattern that ONNX Runtime's gradient builder cannot handle
(or handles into a training model ONNX Runtime cannot run) into an equivalent one
it can. Each is an :class:`onnxblocks.ir.passes.Pass` over one ``ir.Model``
(:func:`normalize` converts the model to the IR once and back once) that reports
how many nodes it rewrote; each is also a function of the same name in snake case
that edits a ``ModelProto`` in place and returns that number. The forward values
are unchanged, so the eval model and the training model compute the same thing as
the original.

:func:`default_passes` runs, in this order (a later pass may rely on an earlier one):

1. ``cast_like_as_cast``: ``CastLike`` has no gradient builder; ``Cast`` has.
2. ``split_to_sequence_as_split`` (then :mod:`~onnxblocks.gradient.dynamic_split`'s two): splits
   ORT misreads.
3. ``inference_dropout_as_identity``: ``DropoutGrad`` ignores
   inference mode;
   then ``expose_dropout_mask``: Dropout's gradient reads its ``mask`` output, which exporters
   leave out.
4. ``layer_norm_zero_bias``: LayerNormalization's gradient reads
   a bias.
5. ``expose_layer_norm_statistics``: ... and its mean / inverse
   std-dev outputs.
6. ``gelu_as_contrib_gelu``: ai.onnx ``Gelu`` (opset 20) has no gradient builder; com.microsoft
   ``Gelu`` has.
7. ``activations_as_elementary``: Elu, PRelu, Mish... as
   elementary ops.
8. ``softplus_as_elementary``: ``Softplus`` (Mish's too) as
   elementary ops.
9. ``conv_transpose_as_conv``: no CPU ``ConvTransposeGrad``
   kernel.
10. ``average_pool_as_conv``: ``AveragePoolGrad`` needs static
    shapes.
11. ``group_norm_as_elementary``: no gradient builder for
    Instance/Group norm.
12. ``recurrent_directions_as_forward``: GRU/LSTM train forward
    only.
13. ``recurrent_as_elementary``: RNN (and non-float32 GRU/LSTM),
    unrolled.
14. ``negative_step_slice_as_gather``: ``SliceGrad`` fails on
    negative steps.
15. ``border_pad_as_gather``: ``Pad``'s gradient is for constant
    mode only.
16. ``resize_as_matmul``: no CPU ``ResizeGrad`` kernel.
17-18. Modules ``extrema``, ``reductions``: no ReduceMax/Min (torch's ties), CumSum gradient, bf16
Max kernel.
19. ``depth_to_space_as_reshape``: Depth/SpaceToDepth have no
    gradient builder.
20-22. Modules ``einsum``, ``comparisons``, ``cross_entropy``: no Einsum gradient, no uint8 Equal
kernel, log_prob.
23-24. Module ``float64``: float64 LayerNormalization and ReduceMean, whose gradients ORT rounds to
float32.

:func:`~onnxblocks.gradient.layer_norm.unshare_norm_constants` and
:mod:`~onnxblocks.gradient.frozen_reads`
are not passes: they run later, on the training copy, with the trainable set (see their docstrings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.naming import NameAuthority
from onnxblocks.gradient.activations import (
    ActivationsAsElementary,
    SoftplusAsElementary,
)
from onnxblocks.gradient.comparisons import SmallIntComparisonAsInt32
from onnxblocks.gradient.conv_transpose import ConvTransposeAsConv
from onnxblocks.gradient.cross_entropy import ExposeCrossEntropyLogProb
from onnxblocks.gradient.dynamic_split import PartlyUsedSplitAsSlice, SplitToSequenceAsSlice
from onnxblocks.gradient.einsum import EinsumAsMatMul
from onnxblocks.gradient.eval_model import InferenceDropoutAsIdentity
from onnxblocks.gradient.extrema import ExtremaWithTorchTies
from onnxblocks.gradient.float64 import Float64LayerNormAsElementary, Float64ReduceMeanAsSumDiv
from onnxblocks.gradient.group_norm import GroupNormAsElementary
from onnxblocks.gradient.indexing import (
    BorderPadAsGather,
    DepthToSpaceAsReshape,
    NegativeStepSliceAsGather,
)
from onnxblocks.gradient.layer_norm import (
    ExposeLayerNormStatistics,
    LayerNormZeroBias,
)
from onnxblocks.gradient.pooling import AveragePoolAsConv
from onnxblocks.gradient.recurrent import RecurrentAsElementary, RecurrentDirectionsAsForward
from onnxblocks.gradient.reductions import CumSumAsMatMul
from onnxblocks.gradient.resize import ResizeAsMatMul
from onnxblocks.ir.attributes import int_attribute, string_attribute
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.rewrite import (
    changed,
    is_default_domain,
    may_apply,
    opset_of,
    run_pass,
)
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.types import ValueTypes
from onnxblocks.ir.writer import Writer

__all__ = [
    "Pass",
    "default_passes",
    "normalize",
]


class ExposeDropoutMask(Pass):
    """Give every ``Dropout`` its ``mask`` output, which its gradient reads.

    The dynamo exporter emits Dropout with its output only (ONNX Runtime then
    fails with ``i < node_->OutputDefs().size()``). The mask gets a fresh name and
    nothing reads it in the forward graph.
    """

    name = "expose_dropout_mask"
    op_types = frozenset({"Dropout"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        names: NameAuthority | None = None
        count = 0
        for node in model.graph:
            if node.op_type != "Dropout" or not is_default_domain(node):
                continue
            if len(node.outputs) >= 2 and node.outputs[1].name:
                continue
            names = names or graph_names(model.graph)
            node.resize_outputs(2)
            node.outputs[1].name = names.fresh(f"{node.outputs[0].name}.mask")
            count += 1
        return {"Dropout": count}


class SplitToSequenceAsSplit(Pass):
    """Rewrite ``SplitToSequence`` read only by ``SequenceAt`` at constant positions into ``Split``.

    The number of pieces comes from the ``split`` input (a list of lengths) or, for
    a chunk length or no ``split``, from the static size of the split axis. A
    sequence that is read any other way, or whose axis size is unknown, is left
    as it is.
    """

    name = "split_to_sequence_as_split"
    op_types = frozenset({"SplitToSequence"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        targets = [n for n in graph if n.op_type == "SplitToSequence" and is_default_domain(n)]
        if not targets:
            return {}
        position = {n: i for i, n in enumerate(graph)}
        constants = ConstantTable(graph)
        types: ValueTypes | None = None
        names = graph_names(graph)
        opset = opset_of(model)
        planned: list[
            tuple[ir.Node, list[ir.Node], list[ir.Node]]
        ] = []  # node, its readers, new nodes
        for node in targets:
            seq = node.outputs[0]
            users = sorted({u.node for u in seq.uses()}, key=lambda n: position.get(n, -1))
            if seq.is_graph_output() or not users:
                continue
            if any(
                u.graph is not graph or u.op_type != "SequenceAt" or u.inputs[0] is not seq
                for u in users
            ):
                continue
            values = [constants.value(u.inputs[1]) for u in users]
            positions = [p for p in values if p is not None and p.size == 1]
            if len(positions) < len(values):
                continue
            axis = int_attribute(node, "axis", 0)
            keepdims = int_attribute(node, "keepdims", 1)
            split_input = node.inputs[1] if len(node.inputs) > 1 else None
            split = constants.value(split_input)
            if split_input is not None and split is None:
                continue
            if split is not None and split.ndim == 1:
                lengths = [int(v) for v in split]
            else:
                if types is None:
                    types = ValueTypes.infer(model)
                shape = types.shape(node.inputs[0])
                if shape is None:
                    continue
                size = shape[axis if axis >= 0 else axis + len(shape)]
                if size is None:
                    continue
                chunk = 1 if split is None else int(split.reshape(()))
                lengths = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
            new_nodes = _split_nodes(
                node, users, positions, lengths, split is None and keepdims == 0, names, opset
            )
            if new_nodes is not None:
                planned.append((node, users, new_nodes))
        for node, users, new_nodes in planned:
            produced = {v.name: v for n in new_nodes for v in n.outputs if v.name}
            olds = [u.outputs[0] for u in users]
            ir.convenience.replace_nodes_and_values(
                graph, node, [node, *users], new_nodes, olds, [produced[v.name or ""] for v in olds]
            )
        return {"SplitToSequence": len(planned)}


def _split_nodes(
    node: ir.Node,
    users: Sequence[ir.Node],
    positions: Sequence[np.ndarray],
    lengths: list[int],
    squeeze: bool,
    names: NameAuthority,
    opset: int,
) -> list[ir.Node] | None:
    """The ``Split`` (and ``Squeeze`` / ``Identity``) nodes computing each reader's output, or
    None.
    """
    seq = node.outputs[0].name or "sequence"
    axis = int_attribute(node, "axis", 0)
    count = len(lengths)
    pieces: list[str] = [""] * count
    first: set[int] = set()
    readers: list[
        tuple[int, str, bool]
    ] = []  # (piece index, reader's output, first reader of the piece)
    for user, pos in zip(users, positions, strict=True):
        index = int(pos.reshape(()))
        index = index + count if index < 0 else index
        if not 0 <= index < count:
            return None
        out = user.outputs[0].name or ""
        readers.append((index, out, index not in first))
        if index not in first:
            first.add(index)
            pieces[index] = names.fresh(f"{out}.unsqueezed") if squeeze else out
    x = node.inputs[0]
    if x is None:
        return None
    w = Writer(names, opset, seq)
    outputs = w.split(x, lengths, axis, [p or names.fresh(f"{seq}.piece") for p in pieces])
    result = dict(enumerate(outputs))  # piece index -> the first reader's value
    for index, out, is_first in readers:
        if is_first and squeeze:
            result[index] = w.squeeze(outputs[index], [axis], out=out)
        elif not is_first:
            w.op("Identity", [result[index]], out=out)
    return w.nodes


class CastLikeAsCast(Pass):
    """Rewrite ``CastLike(x, like)`` into ``Cast(x, to=elem_type(like))`` where that type is
    known.
    """

    name = "cast_like_as_cast"
    op_types = frozenset({"CastLike"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        nodes = [n for n in model.graph if n.op_type == "CastLike" and is_default_domain(n)]
        if not nodes:
            return {}
        types = ValueTypes.infer(model)
        count = 0
        for node in nodes:
            to = types.elem(node.inputs[1] if len(node.inputs) > 1 else None)
            if to is None:
                continue
            saturate = node.attributes.get("saturate")
            node.op_type = "Cast"
            node.resize_inputs(1)
            node.attributes.clear()
            node.attributes["to"] = ir.AttrInt64("to", to)
            if saturate is not None:
                node.attributes["saturate"] = saturate
            count += 1
        return {"CastLike": count}


class GeluAsContribGelu(Pass):
    """Rewrite ai.onnx ``Gelu`` (opset 20) into com.microsoft ``Gelu`` or, for
    ``approximate="tanh"``, ``FastGelu``.

    Both compute the same function and have gradient builders in ONNX Runtime.
    """

    name = "gelu_as_contrib_gelu"
    op_types = frozenset({"Gelu"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        count = 0
        for node in model.graph:
            if node.op_type != "Gelu" or not is_default_domain(node):
                continue
            approximate = string_attribute(node, "approximate", "none")
            node.op_type = "FastGelu" if approximate == "tanh" else "Gelu"
            node.domain = _limits.MS_DOMAIN
            node.attributes.clear()
            count += 1
        if count:
            model.opset_imports.setdefault(_limits.MS_DOMAIN, _limits.MS_OPSET)
        return {"Gelu": count}


def default_passes() -> list[Pass]:
    """The passes :func:`normalize` runs, in order (new instances)."""
    return [
        CastLikeAsCast(),
        SplitToSequenceAsSplit(),
        SplitToSequenceAsSlice(),
        PartlyUsedSplitAsSlice(),
        InferenceDropoutAsIdentity(),
        ExposeDropoutMask(),
        LayerNormZeroBias(),
        ExposeLayerNormStatistics(),
        GeluAsContribGelu(),
        ActivationsAsElementary(),
        SoftplusAsElementary(),
        ConvTransposeAsConv(),
        AveragePoolAsConv(),
        GroupNormAsElementary(),
        RecurrentDirectionsAsForward(),
        RecurrentAsElementary(),
        NegativeStepSliceAsGather(),
        BorderPadAsGather(),
        ResizeAsMatMul(),
        ExtremaWithTorchTies(),
        CumSumAsMatMul(),
        DepthToSpaceAsReshape(),
        EinsumAsMatMul(),
        SmallIntComparisonAsInt32(),
        ExposeCrossEntropyLogProb(),
        Float64LayerNormAsElementary(),
        Float64ReduceMeanAsSumDiv(),
    ]


def normalize(
    model: onnx.ModelProto | ir.Model, passes: Sequence[Pass] | None = None
) -> dict[str, int]:
    """Run the normalisation passes on ``model`` in place, each on the same IR in turn.

    A ``ModelProto`` is converted to the IR once and written back once (only when a pass
    changed it); an ``ir.Model`` is edited as it is. When no pass's op types (``op_types``)
    are top-level ops of the model, no pass runs.

    Args:
        model: The model to normalise (edited in place).
        passes: The passes to run, in order; :func:`default_passes` by default.

    Returns:
        How many nodes each pass rewrote, by pass name.
    """
    passes = default_passes() if passes is None else passes
    if not may_apply(passes, model):  # nothing to rewrite: no pass runs (nor builds the IR)
        return {p.name or type(p).__name__: 0 for p in passes}
    ir_model = model if isinstance(model, ir.Model) else from_proto(model)
    report = {p.name or type(p).__name__: changed(run_pass(p, ir_model)) for p in passes}
    if isinstance(model, onnx.ModelProto) and any(report.values()):
        model.CopyFrom(to_proto(ir_model))
    return report
