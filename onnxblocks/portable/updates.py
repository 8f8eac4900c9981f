"""One optimizer step for every parameter, in the multi-tensor layout.

:func:`update_parameters` applies an :class:`~onnxblocks.portable.optimizer_spec.OptimizerSpec`'s
rule (:mod:`onnxblocks.portable.rules`: torch's arithmetic, or the training build's kernels) to
every parameter through its group (:class:`~onnxblocks.portable.groups.GroupUpdater`), updating
small tensors together in flat buffers. It serves the portable optimizer models
(:mod:`onnxblocks.portable.optimizer`) and the fused step model (:mod:`onnxblocks.portable.step`);
:mod:`onnxblocks.portable.clipping` writes the gradient clipping before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxblocks._core.naming import NameAuthority
from onnxblocks.portable import groups as _groups
from onnxblocks.portable.clipping import CLIP_EPSILON, clip, clip_gradients
from onnxblocks.portable.lowering_context import Writer, numpy_type
from onnxblocks.portable.optimizer_spec import OptimizerSpec


class OptimizerWriter(Writer):
    """A :class:`~onnxblocks.portable.lowering_context.Writer` writing each scalar constant once.

    Stock onnxruntime merges equal scalar initializers and removes the copies, warning
    "Removing initializer ..." for each: an optimizer graph shares its scalars instead.
    """

    def __init__(self, names: NameAuthority, opset: int, hint: str) -> None:
        super().__init__(names, opset, hint)
        self._scalars: dict[tuple[str, bytes, tuple[int, ...]], ir.Value] = {}

    def scalar(
        self, value: float | int, dtype: Any = np.float32, shape: Sequence[int] = ()
    ) -> ir.Value:
        """The constant of ``dtype`` holding ``value`` (one node per distinct value, type and
        shape).
        """
        array = np.full(
            tuple(shape), value, dtype=numpy_type(dtype if dtype is not None else np.float32)
        )
        key = (array.dtype.str, array.tobytes(), tuple(array.shape))
        if key not in self._scalars:
            self._scalars[key] = super().scalar(value, dtype, shape)
        return self._scalars[key]


#: Parameters of at most this many elements are updated together, in flat buffers
#: (:func:`update_parameters`).
#: Above it a tensor's own elementwise passes cost more than their nodes' dispatch, and flattening
#: (a ``Concat`` of each input, a ``Split`` of each output) would only add passes over memory.
FLAT_LIMIT = 1 << 18

#: The most tensors one ``Concat`` joins (one ``Split`` writes) into the flat buffers; more are
#: joined as a tree. WebGPU binds each input and output of a kernel as a storage buffer, and its
#: default limit is 8 per shader stage: onnxruntime-web's WebGPU ``Concat`` of 16 adapters fails
#: validation and the step silently writes zeros. Joining moves data only: the update is unchanged.
MAX_PIECES = 7


def _numel(value: ir.Value) -> int | None:
    """The element count of ``value`` when its shape is static, else None."""
    if value.shape is None or not value.shape.is_static():
        return None
    return math.prod(value.shape.numpy())


def _concat(w: Writer, parts: list[ir.Value]) -> ir.Value:
    """``parts`` joined along axis 0, at most :data:`MAX_PIECES` per ``Concat``."""
    while len(parts) > MAX_PIECES:
        chunks = [parts[i : i + MAX_PIECES] for i in range(0, len(parts), MAX_PIECES)]
        parts = [w.concat(c, 0) if len(c) > 1 else c[0] for c in chunks]
    return w.concat(parts, 0)


def _split(
    w: Writer, value: ir.Value, sizes: list[int], outs: Sequence[str | ir.Value]
) -> list[ir.Value]:
    """``value`` split along axis 0 into ``sizes`` named ``outs``, at most :data:`MAX_PIECES` per
    ``Split``.
    """
    if len(sizes) <= MAX_PIECES:
        return w.split(value, sizes, 0, outs)
    per = math.ceil(len(sizes) / MAX_PIECES)
    starts = range(0, len(sizes), per)
    chunks = w.split(
        value,
        [sum(sizes[b : b + per]) for b in starts],
        0,
        [outs[b] if len(sizes[b : b + per]) == 1 else w.fresh("chunk") for b in starts],
    )
    pieces: list[ir.Value] = []
    for b, chunk in zip(starts, chunks, strict=True):
        if len(sizes[b : b + per]) == 1:
            pieces.append(chunk)
        else:
            pieces.extend(_split(w, chunk, sizes[b : b + per], outs[b : b + per]))
    return pieces


def _static_shape(value: ir.Value) -> tuple[int, ...]:
    assert value.shape is not None, "grouped parameters have static shapes"
    return tuple(int(d) for d in value.shape.numpy())


def _flat(w: Writer, value: ir.Value) -> ir.Value:
    return value if value.shape is not None and len(value.shape) == 1 else w.reshape(value, [-1])


def update_parameters(
    w: Writer,
    spec: OptimizerSpec,
    learning_rate: ir.Value,
    step: ir.Value,
    params: Sequence[ir.Value],
    grads: Sequence[ir.Value],
    moments: Sequence[Sequence[ir.Value]],
    outs: Sequence[Sequence[str | ir.Value]],
    flat_limit: int | None = None,
    names: Sequence[str] | None = None,
) -> list[list[ir.Value]]:
    """Write one optimizer step for every parameter: each writes ``outs[i] = (p, *moments)`` (SGD:
    ``(p,)``).

    Multi-tensor layout: the parameters of at most ``flat_limit`` elements (static shapes) are
    updated together,
    per element type: their parameters, gradients and moments flattened and concatenated into one
    buffer each,
    every elementwise op of the update run once over the buffer, and the results split back to each
    parameter's shape and output name (what torch's ``foreach`` optimizers do with their tensor
    lists). The
    arithmetic per element is the same ops in the same order, so the results equal the per-tensor
    update bit
    for bit; a model of many small tensors (biases, norms, depthwise kernels) runs a few dozen nodes
    for them
    instead of 13 per tensor. Larger parameters keep their own update (flattening would cost more
    passes over
    memory than the nodes it saves).

    Args:
        w: The writer.
        spec: The optimizer.
        learning_rate: The ``[1]`` float learning rate.
        step: The ``[1]`` int64 step being taken (read by AdamW's bias corrections).
        params: The parameters.
        grads: Their (clipped) gradients.
        moments: Per parameter, its moments (AdamW: two; SGD: none read).
        outs: Per parameter, the names (or values) of the updated parameter and moments.
        flat_limit: The largest tensor updated in the flat buffers (0: none; default
        :data:`FLAT_LIMIT`).
        names: The parameters' names, for an optimizer with parameter groups (default: the values'
        names);
            parameters are flattened together per element type and group (a rule reading
            whole-tensor norms,
            Lamb, never).

    Returns:
        Per parameter, the values written to ``outs[i]``.
    """
    limit = FLAT_LIMIT if flat_limit is None else flat_limit
    rule = _groups.GroupUpdater(w, spec.layout(), learning_rate, step)
    keys: list[str] = [str(p.name) for p in params] if names is None else list(names)
    group_of = rule.group_of
    update = rule

    count = len(params)
    result: list[list[ir.Value] | None] = [None] * count
    groups: dict[tuple[object, int], list[int]] = {}
    for i, p in enumerate(params):
        size = _numel(p)
        flat = rule.layout.rule.elementwise  # Lamb reads each tensor's norm: never flattened
        if flat and size is not None and 0 < size <= limit and p.dtype is not None:
            groups.setdefault((p.dtype, group_of.get(keys[i], 0)), []).append(i)
        else:
            group = group_of.get(keys[i], 0)
            result[i] = update(group, params[i], grads[i], moments[i], outs[i])
    for (_, group), members in groups.items():
        if len(members) == 1:
            (i,) = members
            result[i] = update(group, params[i], grads[i], moments[i], outs[i])
            continue
        arity = 1 + spec.updated_states

        def joined(tensors: Sequence[ir.Value], members: list[int] = members) -> ir.Value:
            return _concat(w, [_flat(w, tensors[i]) for i in members])

        flat_moments = [joined([moments[i][k] for i in range(count)]) for k in range(arity - 1)]
        new = update(
            group,
            joined(params),
            joined(grads),
            flat_moments,
            [w.fresh("flat") for _ in range(arity)],
        )
        sizes = [int(_numel(params[i]) or 0) for i in members]
        for k, value in enumerate(new):
            shapes = [list(_static_shape(params[i])) for i in members]
            pieces = _split(
                w,
                value,
                sizes,
                [
                    outs[i][k] if len(shape) == 1 else w.fresh("piece")
                    for i, shape in zip(members, shapes, strict=True)
                ],
            )
            for i, shape, piece in zip(members, shapes, pieces, strict=True):
                written = piece if len(shape) == 1 else w.reshape(piece, shape, outs[i][k])
                slot = result[i]
                if slot is None:
                    slot = result[i] = []
                slot.append(written)
    return [r if r is not None else [] for r in result]


__all__ = [
    "CLIP_EPSILON",
    "FLAT_LIMIT",
    "OptimizerSpec",
    "OptimizerWriter",
    "clip",
    "clip_gradients",
    "update_parameters",
]
