"""The flat-state form of the fused step model: the trainable parameters and their optimizer state
passed as one float32 tensor each way.

ONNX Runtime's JavaScript APIs copy every input into the runtime and every output out on each
run, at a cost per tensor that outweighs a small model's compute: the demo MLP's step has 22
inputs and 20 outputs, 18 of each its parameters and AdamW's moments. :class:`FlattenState`
cuts those tensors from one input :data:`~onnxblocks._core.contracts.FLAT_STATE` (``Split``,
``Reshape``) and joins the updated ones into one output ``FLAT_STATE + ".out"`` (``Reshape``,
``Concat``). Every other node is the step model's own, reading the same values: the losses and
the updated tensors equal the step model's bit for bit. The layout (each tensor's name, offset
and shape, in the flat tensor's order) is the model's metadata under ``FLAT_STATE``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import onnx_ir as ir

from onnxblocks._core import limits as _limits
from onnxblocks._core.contracts import FLAT_STATE, updated_name
from onnxblocks._core.errors import PortabilityError
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.portable.lowering_context import Writer
from onnxblocks.portable.updates import _concat, _split


class FlattenState(Pass):
    """Turn a fused step model into its flat-state form (in place).

    The carried tensors are the inputs ``v`` with an output ``v.out`` (each trainable parameter
    and its optimizer state), in the order of the inputs; the flat input takes the place of the
    first, the flat output follows the others.
    """

    name = "flat_state"

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        """Raises: PortabilityError: for a model with nothing carried, a carried tensor that is
        not float32 or whose shape is not static, or a model already flat.
        """
        graph = model.graph
        outputs = {v.name: v for v in graph.outputs}
        if FLAT_STATE in {v.name for v in graph.inputs}:
            raise PortabilityError(f"The model already takes '{FLAT_STATE}': it is flat already.")
        carried = [v for v in graph.inputs if updated_name(v.name or "") in outputs]
        if not carried:
            raise PortabilityError(
                "The model has no input 'p' with an output 'p.out': is it a fused step model "
                "(step_model.onnx of portable artifacts)?"
            )
        shapes = [_float32_shape(v) for v in carried]
        sizes = [math.prod(s) for s in shapes]
        total = sum(sizes)
        opset = graph.opset_imports.get("", _limits.DEFAULT_ONNX_OPSET)
        w = Writer(graph_names(graph), opset, "flat_state")
        flat = ir.Value(
            name=FLAT_STATE, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([total])
        )
        pieces = _split(w, flat, sizes, [w.fresh("piece") for _ in carried])
        for value, piece, shape in zip(carried, pieces, shapes, strict=True):
            cut = piece if len(shape) == 1 else w.reshape(piece, list(shape))
            cut.type, cut.shape = value.type, ir.Shape(shape)
            ir.convenience.replace_all_uses_with(value, cut)
        reads = w.nodes
        if len(graph) and reads:
            graph.insert_before(graph[0], reads)
        else:
            graph.extend(reads)

        w.nodes = []
        updated = [outputs[updated_name(v.name or "")] for v in carried]
        joined = _concat(
            w,
            [
                u if len(s) == 1 else w.reshape(u, [-1])
                for u, s in zip(updated, shapes, strict=True)
            ],
        )
        joined.name = updated_name(FLAT_STATE)
        joined.type, joined.shape = flat.type, ir.Shape([total])
        graph.extend(w.nodes)

        first = graph.inputs.index(carried[0])
        kept_in = [v for v in graph.inputs if v not in carried]
        kept_in.insert(first, flat)  # the inputs before the first carried one are all kept
        gone = set(updated)
        kept_out = [v for v in graph.outputs if v not in gone]
        graph.inputs.clear()
        graph.inputs.extend(kept_in)
        graph.outputs.clear()
        graph.outputs.extend([*kept_out, joined])

        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        layout = [[v.name, o, list(s)] for v, o, s in zip(carried, offsets, shapes, strict=True)]
        model.metadata_props[FLAT_STATE] = json.dumps(layout, separators=(",", ":"))
        return {"carried": len(carried)}


def _float32_shape(value: ir.Value) -> tuple[int, ...]:
    if value.dtype != ir.DataType.FLOAT:
        raise PortabilityError(
            f"'{value.name}' is {value.dtype}: the flat state holds float32 tensors only; "
            "train it with the step model (step_model.onnx) instead."
        )
    if value.shape is None or not value.shape.is_static():
        raise PortabilityError(
            f"'{value.name}' has no static shape ({value.shape}): the flat state's layout needs "
            "every carried tensor's size; train it with the step model (step_model.onnx)."
        )
    return tuple(int(d) for d in value.shape.numpy())
