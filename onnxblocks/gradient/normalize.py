"""Graph normalisation passes that run before ONNX Runtime builds the gradient.

Each pass rewrites a pattern that ONNX Runtime's gradient builder cannot handle
(or handles into a training model ONNX Runtime cannot run) into an equivalent one
it can, in place on the working copy of the model, and returns how many nodes it
rewrote. The forward values are unchanged, so the eval model and the training
model compute the same thing as the original.

:func:`default_passes` runs, in this order (a later pass may rely on an earlier one):

1. :func:`cast_like_as_cast`: ``CastLike`` has no gradient builder; ``Cast`` has.
2. :func:`split_to_sequence_as_split`: ``SplitToSequence`` + ``SequenceAt`` is "unreachable"; ``Split`` is not.
3. :func:`expose_dropout_mask`: Dropout's gradient reads its ``mask`` output, which exporters leave out.
4. :func:`~onnxblocks.gradient.layer_norm.layer_norm_zero_bias`: LayerNormalization's gradient reads a bias.
5. :func:`~onnxblocks.gradient.layer_norm.expose_layer_norm_statistics`: ... and its mean / inverse std-dev outputs.
6. :func:`gelu_as_contrib_gelu`: ai.onnx ``Gelu`` (opset 20) has no gradient builder; com.microsoft ``Gelu`` has.
7. :func:`~onnxblocks.gradient.activations.activations_as_elementary`: Elu, PRelu, Mish... as elementary ops.
8. :func:`softplus_as_elementary`: ``Softplus`` (also from Mish, step 7) as Exp, Log, Min and Where.
9. :func:`~onnxblocks.gradient.conv_transpose.conv_transpose_as_conv`: no CPU ``ConvTransposeGrad`` kernel.
10. :func:`~onnxblocks.gradient.pooling.average_pool_as_conv`: ``AveragePoolGrad`` needs static shapes.
11. :func:`~onnxblocks.gradient.group_norm.group_norm_as_elementary`: no gradient builder for Instance/Group norm.
12. :func:`~onnxblocks.gradient.recurrent.recurrent_directions_as_forward`: GRU/LSTM train forward only.
13. :func:`~onnxblocks.gradient.recurrent.recurrent_as_elementary`: RNN (and non-float32 GRU/LSTM), unrolled.
14. :func:`~onnxblocks.gradient.indexing.negative_step_slice_as_gather`: ``SliceGrad`` fails on negative steps.
15. :func:`~onnxblocks.gradient.indexing.border_pad_as_gather`: ``Pad``'s gradient is for constant mode only.
16. :func:`~onnxblocks.gradient.resize.resize_as_matmul`: no CPU ``ResizeGrad`` kernel.
17. :func:`~onnxblocks.gradient.reductions.reduce_extremum_as_topk`: ReduceMax/Min have no gradient builder.
18. :func:`~onnxblocks.gradient.reductions.cumsum_as_matmul`: ``CumSum`` has no gradient builder.
19. :func:`~onnxblocks.gradient.indexing.depth_to_space_as_reshape`: Depth/SpaceToDepth have no gradient builder.

:func:`~onnxblocks.gradient.layer_norm.unshare_layer_norm_constants` is not a pass:
it needs the trainable set and runs later, on the training copy (see its docstring).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.naming import NameAuthority
from onnxblocks.gradient import _graph
from onnxblocks.gradient.activations import activations_as_elementary
from onnxblocks.gradient.conv_transpose import conv_transpose_as_conv
from onnxblocks.gradient.folding import ConstantTable
from onnxblocks.gradient.group_norm import group_norm_as_elementary
from onnxblocks.gradient.indexing import (
    border_pad_as_gather,
    depth_to_space_as_reshape,
    negative_step_slice_as_gather,
)
from onnxblocks.gradient.layer_norm import expose_layer_norm_statistics, layer_norm_zero_bias
from onnxblocks.gradient.pooling import average_pool_as_conv
from onnxblocks.gradient.recurrent import recurrent_as_elementary, recurrent_directions_as_forward
from onnxblocks.gradient.reductions import cumsum_as_matmul, reduce_extremum_as_topk
from onnxblocks.gradient.resize import resize_as_matmul

Pass = Callable[[onnx.ModelProto], int]

__all__ = [
    "Pass",
    "cast_like_as_cast",
    "default_passes",
    "expose_dropout_mask",
    "expose_layer_norm_statistics",
    "gelu_as_contrib_gelu",
    "layer_norm_zero_bias",
    "normalize",
    "softplus_as_elementary",
    "split_to_sequence_as_split",
]


def expose_dropout_mask(model: onnx.ModelProto) -> int:
    """Give every ``Dropout`` its ``mask`` output, which its gradient reads.

    The dynamo exporter emits Dropout with its output only (ONNX Runtime then
    fails with ``i < node_->OutputDefs().size()``). The mask gets a fresh name and
    nothing reads it in the forward graph.

    Returns:
        The number of nodes that got a mask output.
    """
    names = _graph.name_authority(model.graph)
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Dropout" or not _graph.is_default_domain(node):
            continue
        if len(node.output) >= 2 and node.output[1]:
            continue
        del node.output[1:]
        node.output.append(names.fresh(f"{node.output[0]}.mask"))
        changed += 1
    return changed


def split_to_sequence_as_split(model: onnx.ModelProto) -> int:
    """Rewrite ``SplitToSequence`` read only by ``SequenceAt`` at constant positions into ``Split``.

    The number of pieces comes from the ``split`` input (a list of lengths) or, for
    a chunk length or no ``split``, from the static size of the split axis. A
    sequence that is read any other way, or whose axis size is unknown, is left
    as it is.

    Returns:
        The number of SplitToSequence nodes rewritten.
    """
    graph = model.graph
    readers = _graph.consumers(graph)
    outputs = {o.name for o in graph.output}
    types: dict[str, onnx.TypeProto] | None = None
    names = _graph.name_authority(graph)
    opset = _limits.onnx_opset(model) or _limits.DEFAULT_ONNX_OPSET
    changed = 0
    new_nodes: list[onnx.NodeProto] = []
    dropped: set[int] = set()  # node indices
    replacements: dict[int, list[onnx.NodeProto]] = {}  # node index -> nodes replacing it
    constants = ConstantTable(graph)
    position = {n.output[0]: i for i, n in enumerate(graph.node) if n.output}
    for node_index, node in enumerate(graph.node):
        if node.op_type != "SplitToSequence" or node.domain not in ("", "ai.onnx"):
            continue
        seq = node.output[0]
        users = readers.get(seq, [])
        if seq in outputs or not users or any(u.op_type != "SequenceAt" or u.input[0] != seq for u in users):
            continue
        values = [constants.value(u.input[1]) for u in users]
        positions = [p for p in values if p is not None and p.size == 1]
        if len(positions) < len(values):
            continue
        axis = _graph.int_attribute(node, "axis", 0)
        keepdims = _graph.int_attribute(node, "keepdims", 1)
        split = constants.value(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if len(node.input) > 1 and node.input[1] and split is None:
            continue
        if split is not None and split.ndim == 1:
            lengths = [int(v) for v in split]
        else:
            if types is None:
                types = _graph.infer_types(model)
            shape = _graph.shape_of(types, node.input[0])
            if shape is None:
                continue
            size = shape[axis if axis >= 0 else axis + len(shape)]
            if size is None:
                continue
            chunk = 1 if split is None else int(split.reshape(()))
            lengths = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
        squeeze = split is None and keepdims == 0
        count = len(lengths)
        pieces: list[str] = [""] * count
        extra: list[onnx.NodeProto] = []
        final: dict[int, str] = {}
        for user, pos in zip(users, positions, strict=True):
            index = int(pos.reshape(()))
            index = index + count if index < 0 else index
            if not 0 <= index < count:
                break
            if index not in final:
                final[index] = user.output[0]
                if squeeze:
                    pieces[index] = names.fresh(f"{user.output[0]}.unsqueezed")
                    extra.extend(_squeeze(pieces[index], user.output[0], axis, opset, names))
                else:
                    pieces[index] = user.output[0]
            else:
                extra.append(
                    helper.make_node("Identity", [final[index]], [user.output[0]], name=names.fresh("Identity"))
                )
        else:
            pieces = [p or names.fresh(f"{seq}.piece") for p in pieces]
            rewritten = []
            if opset >= 13:
                lengths_name = names.fresh(f"{seq}.lengths")
                rewritten.append(_graph.constant_node(lengths_name, np.array(lengths, dtype=np.int64), names))
                rewritten.append(
                    helper.make_node(
                        "Split",
                        [node.input[0], lengths_name],
                        pieces,
                        name=node.name or names.fresh("Split"),
                        axis=axis,
                    )
                )
            else:
                rewritten.append(
                    helper.make_node(
                        "Split",
                        [node.input[0]],
                        pieces,
                        name=node.name or names.fresh("Split"),
                        axis=axis,
                        split=lengths,
                    )
                )
            replacements[node_index] = rewritten + extra
            dropped.update(position[u.output[0]] for u in users)
            changed += 1
    if not changed:
        return 0
    for i, node in enumerate(graph.node):
        if i in replacements:
            new_nodes.extend(replacements[i])
        elif i not in dropped:
            new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    return changed


def _squeeze(src: str, dst: str, axis: int, opset: int, names: NameAuthority) -> list[onnx.NodeProto]:
    """Nodes computing ``dst = Squeeze(src, axis)`` at ``opset``."""
    if opset >= 13:
        axes = names.fresh(f"{dst}.axes")
        return [
            _graph.constant_node(axes, np.array([axis], dtype=np.int64), names),
            helper.make_node("Squeeze", [src, axes], [dst], name=names.fresh("Squeeze")),
        ]
    return [helper.make_node("Squeeze", [src], [dst], name=names.fresh("Squeeze"), axes=[axis])]


def cast_like_as_cast(model: onnx.ModelProto) -> int:
    """Rewrite ``CastLike(x, like)`` into ``Cast(x, to=elem_type(like))`` where that type is known.

    Returns:
        The number of CastLike nodes rewritten.
    """
    nodes = [n for n in model.graph.node if n.op_type == "CastLike" and n.domain in ("", "ai.onnx")]
    if not nodes:
        return 0
    types = _graph.infer_types(model)
    changed = 0
    for node in nodes:
        to = _graph.elem_type(types, node.input[1])
        if to is None:
            continue
        attrs = [helper.make_attribute("to", to)]
        saturate = _graph.attribute(node, "saturate")
        if saturate is not None:
            attrs.append(helper.make_attribute("saturate", saturate))
        node.op_type = "Cast"
        del node.input[1:]
        del node.attribute[:]
        node.attribute.extend(attrs)
        changed += 1
    return changed


def gelu_as_contrib_gelu(model: onnx.ModelProto) -> int:
    """Rewrite ai.onnx ``Gelu`` (opset 20) into com.microsoft ``Gelu`` or, for ``approximate="tanh"``, ``FastGelu``.

    Both compute the same function and have gradient builders in ONNX Runtime.

    Returns:
        The number of Gelu nodes rewritten.
    """
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Gelu" or node.domain not in ("", "ai.onnx"):
            continue
        approximate = _graph.string_attribute(node, "approximate", "none")
        node.op_type = "FastGelu" if approximate == "tanh" else "Gelu"
        node.domain = _limits.MS_DOMAIN
        del node.attribute[:]
        changed += 1
    if changed:
        _limits.ensure_opset(model, _limits.MS_DOMAIN, _limits.MS_OPSET)
    return changed


#: Above this input, softplus(x) is x to float precision (torch.nn.Softplus's default threshold).
SOFTPLUS_THRESHOLD = 20.0


def softplus_as_elementary(model: onnx.ModelProto) -> int:
    """Rewrite ``Softplus(x)`` into ``Where(x > 20, x, Log(1 + Exp(Min(x, 20))))``.

    That is torch's Softplus (threshold 20); it differs from ``log(1 + exp(x))``
    by less than 2e-9 relative above the threshold. ``Min`` keeps ``Exp`` finite in
    the branch ``Where`` does not take, so its gradient is never ``0 * inf``.
    Nodes whose input type is unknown are left as they are.

    Returns:
        The number of Softplus nodes rewritten.
    """
    return _graph.rewrite_nodes(
        model, lambda n: n.op_type == "Softplus" and n.domain in ("", "ai.onnx"), _softplus, min_opset=None
    )


def _softplus(node: onnx.NodeProto, ctx: _graph.RewriteContext) -> list[onnx.NodeProto] | None:
    x, y, names = node.input[0], node.output[0], ctx.names
    dtype = ctx.dtype(x)
    if dtype is None:
        return None
    limit, one = names.fresh(f"{y}.threshold"), names.fresh(f"{y}.one")
    clipped, exp, plus, log, above = (names.fresh(f"{y}.{s}") for s in ("clipped", "exp", "plus1", "log", "above"))
    return [
        _graph.constant_node(limit, np.array(SOFTPLUS_THRESHOLD, dtype=dtype), names),
        _graph.constant_node(one, np.array(1, dtype=dtype), names),
        helper.make_node("Min", [x, limit], [clipped], name=names.fresh("Min")),
        helper.make_node("Exp", [clipped], [exp], name=names.fresh("Exp")),
        helper.make_node("Add", [exp, one], [plus], name=names.fresh("Add")),
        helper.make_node("Log", [plus], [log], name=names.fresh("Log")),
        helper.make_node("Greater", [x, limit], [above], name=names.fresh("Greater")),
        helper.make_node("Where", [above, x, log], [y], name=node.name or names.fresh("Where")),
    ]


def default_passes() -> list[Pass]:
    """The passes :func:`normalize` runs, in order."""
    return [
        cast_like_as_cast,
        split_to_sequence_as_split,
        expose_dropout_mask,
        layer_norm_zero_bias,
        expose_layer_norm_statistics,
        gelu_as_contrib_gelu,
        activations_as_elementary,
        softplus_as_elementary,
        conv_transpose_as_conv,
        average_pool_as_conv,
        group_norm_as_elementary,
        recurrent_directions_as_forward,
        recurrent_as_elementary,
        negative_step_slice_as_gather,
        border_pad_as_gather,
        resize_as_matmul,
        reduce_extremum_as_topk,
        cumsum_as_matmul,
        depth_to_space_as_reshape,
    ]


def normalize(model: onnx.ModelProto, passes: list[Pass] | None = None) -> dict[str, int]:
    """Run the normalisation passes on ``model`` in place.

    Returns:
        How many nodes each pass rewrote, by pass name.
    """
    return {p.__name__: p(model) for p in (default_passes() if passes is None else passes)}
