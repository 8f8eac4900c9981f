"""Folding LoRA adapters into their base weights: ``W + scale * B @ A``, adapter branches removed.

:func:`merge_lora` turns a model with LoRA adapters (:func:`onnxblocks.peft.apply_lora`, or an
exported eval model) into the plain model ``peft``'s ``merge_and_unload()`` gives: each adapted
layer's weight becomes ``W + (lora_alpha / r) * B @ A``, written in the layout and dtype the
graph stores ``W`` in (``[out, in]`` or ``[in, out]``; float32, float16 or bfloat16: the sum is
computed in float32 and rounded once), and the adapter branch (its MatMuls, dropout, scale and
the Add that joins it to the layer's output) is removed with the adapter tensors.
``TrainingSession.export_inference_model(..., merge_adapters=True)`` uses the same two steps
(:func:`strip_adapter_branches`, :func:`fold`) with the trained adapters.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from onnxblocks._core.contracts import LORA_METADATA
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, UnknownNameError
from onnxblocks.peft.info import LoraInfo, LoraTarget, lora_info

if (
    TYPE_CHECKING
):  # the IR is loaded when merging: `import onnxblocks.peft` stays light for the runtime
    import onnx_ir as ir

__all__ = ["fold", "merge_lora", "strip_adapter_branches"]

#: Ops a base weight may pass through before its MatMul or Gemm (a transposed or cast frozen base).
_WEIGHT_PATH_OPS = frozenset({"Transpose", "Cast", "Identity", "CastLike", "Reshape"})
#: Integer element types a quantized base weight is stored in (``base_dtype="int8"/"int4"``).
_QUANTIZED = frozenset({"INT8", "INT4", "UINT8", "UINT4"})
#: Most nodes an adapter branch may have (x @ A^T @ B^T * s, dropout, casts...); a guard, not a
#: limit in practice.
_MAX_BRANCH_NODES = 64


def fold(
    weight: np.ndarray, lora_a: np.ndarray, lora_b: np.ndarray, scale: float, layout: str
) -> np.ndarray:
    """``weight + scale * B @ A`` in ``weight``'s layout and dtype.

    Args:
        weight: The base weight as the graph stores it: ``[out, in]`` (``layout="out_in"``) or
        ``[in, out]``.
        lora_a: ``[r, in]``.
        lora_b: ``[out, r]``.
        scale: ``lora_alpha / r``.
        layout: ``"out_in"`` or ``"in_out"``.

    Returns:
        The merged weight, same shape and dtype as ``weight`` (computed in float32, or float64 for a
        float64 base).

    Raises:
        InvalidValueError: if the shapes do not fit each other.
    """
    wide = np.float64 if weight.dtype == np.float64 else np.float32
    a, b = np.asarray(lora_a, dtype=wide), np.asarray(lora_b, dtype=wide)
    if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0]:
        raise InvalidValueError(
            f"LoRA adapters of shapes A {list(a.shape)} and B {list(b.shape)} do not chain."
        )
    delta = (b @ a) * wide(scale)
    if layout == "in_out":
        delta = delta.T
    if weight.shape != delta.shape:
        raise InvalidValueError(
            f"the base weight has shape {list(weight.shape)} ({layout}), the adapters B @ A give "
            f"{list(delta.shape)}."
        )
    return (weight.astype(wide) + delta).astype(weight.dtype)


def _weight_anchors(graph: ir.Graph, weight: ir.Value, target: LoraTarget) -> set[ir.Value]:
    """The base weight, what it becomes on its way to its MatMul/Gemm, and that node's output."""
    anchors = {weight}
    frontier = [weight]
    while frontier:
        value = frontier.pop()
        for node, _ in value.uses():
            if node.graph is not graph:
                continue
            if node.op_type in _WEIGHT_PATH_OPS and node.domain in ("", "ai.onnx"):
                anchors.update(node.outputs)
                frontier.extend(node.outputs)
            elif node.op_type in ("MatMul", "Gemm"):
                anchors.update(node.outputs)
    for node in graph:
        if node.name == target.node:
            anchors.update(node.outputs)
    return anchors


def _strip_one(
    graph: ir.Graph, values: Mapping[str, ir.Value], module: str, target: LoraTarget
) -> bool:
    """Remove the adapter branch of one target; False when the cut graph no longer holds the
    layer.
    """
    a, b, weight = values.get(target.lora_A), values.get(target.lora_B), values.get(target.weight)
    if a is None and b is None:
        return False
    if a is None or b is None or weight is None:
        missing = [
            n
            for n, v in ((target.lora_A, a), (target.lora_B, b), (target.weight, weight))
            if v is None
        ]
        raise InvalidValueError(
            f"Cannot merge the adapters of '{module}': the graph has no value {missing}. The "
            "model's "
            f"'{LORA_METADATA}' metadata does not match its graph; apply LoRA again."
        )
    anchors = _weight_anchors(graph, weight, target)
    branch: list[ir.Node] = []
    frontier, seen = [a, b], {a, b}
    join: ir.Node | None = None
    while frontier and join is None:
        value = frontier.pop(0)
        for node, _ in value.uses():
            if any(v in anchors for v in node.inputs if v is not None):
                join = node
                break
            if node in branch:
                continue
            branch.append(node)
            if len(branch) > _MAX_BRANCH_NODES:
                break
            for out in node.outputs:
                if out not in seen:
                    seen.add(out)
                    frontier.append(out)
    if join is None or len(join.outputs) != 1 or join.op_type not in ("Add", "Sum"):
        raise InvalidValueError(
            f"Cannot merge the adapters of '{module}': no Add joins their branch to the layer "
            f"'{target.node}'. merge_lora handles the graphs apply_lora writes."
        )
    import onnx_ir as ir

    kept = next(v for v in join.inputs if v is not None and v in anchors)
    out = join.outputs[0]
    if out.is_graph_output():
        index = graph.outputs.index(out)
        graph.outputs[index] = kept
        kept.name, out.name = (
            out.name,
            f"{out.name}.lora_joined",
        )  # the model's output keeps its name
        kept.type, kept.shape = out.type, out.shape
    ir.convenience.replace_all_uses_with(out, kept)
    return True


def strip_adapter_branches(model: ir.Model, info: LoraInfo) -> list[LoraTarget]:
    """Remove, in place, the adapter branch of every target the graph still holds, and the adapters.

    Args:
        model: The model (an eval or inference model with LoRA adapters).
        info: Its LoRA record.

    Returns:
        The targets whose branch was removed: fold their adapters into their ``weight``
        (:func:`fold`).

    Raises:
        InvalidValueError: if the graph does not have the branch the record describes.
    """
    from onnxblocks.ir.edit import remove_unused_nodes, values_by_name

    graph = model.graph
    values = values_by_name(graph)
    quantized = [
        t.weight
        for t in info.targets.values()
        if t.weight in values and getattr(values[t.weight].dtype, "name", None) in _QUANTIZED
    ]
    if quantized:
        raise InvalidValueError(
            f"Cannot merge the adapters into the quantized (int8/int4) base weights "
            f"{quantized[:3]}: W + B @ A is not on their quantization grid. Export without "
            "merging (the base stays quantized, the adapters beside it), or generate the "
            "artifacts with a float base to merge."
        )
    stripped = [t for module, t in info.targets.items() if _strip_one(graph, values, module, t)]
    remove_unused_nodes(graph)
    for target in stripped:
        for name in (target.lora_A, target.lora_B):
            value = values[name]
            if value.uses():
                raise InvalidValueError(
                    f"Cannot merge: '{name}' is still read outside its adapter branch (by "
                    f"{sorted({n.name or n.op_type for n, _ in value.uses()})})."
                )
            graph.initializers.pop(name, None)
            if value in graph.inputs:
                graph.inputs.remove(value)
    for name, value in list(graph.initializers.items()):  # the branch's scale constants
        if not value.uses() and not value.is_graph_output() and value not in graph.inputs:
            graph.initializers.pop(name)
    model.metadata_props.pop(LORA_METADATA, None)
    return stripped


def merge_lora(
    model: onnx.ModelProto,
    adapters: Mapping[str, np.ndarray] | None = None,
    *,
    base_dir: str | os.PathLike | None = None,
) -> onnx.ModelProto:
    """A copy of ``model`` with its LoRA adapters folded into the base weights (PEFT's
    ``merge_and_unload``).

    Args:
        model: A model with LoRA adapters (``onnxblocks.lora`` metadata). It is not changed.
        adapters: Adapter values by initializer name; default: the model's own initializers.
        base_dir: The directory external data locations are relative to (the model file's
        directory).

    Returns:
        The merged model: no adapter nodes, tensors or ``onnxblocks.lora`` metadata.

    Raises:
        InvalidTypeError: if ``model`` is not a ModelProto.
        InvalidValueError: if the model has no LoRA adapters, or its graph does not fit its record.
        UnknownNameError: if an adapter has no value.
    """
    if not isinstance(model, onnx.ModelProto):
        raise InvalidTypeError(f"merge_lora takes an onnx.ModelProto, not {type(model).__name__}.")
    info = lora_info(model)
    if info is None:
        raise InvalidValueError(
            f"merge_lora: the model has no '{LORA_METADATA}' metadata, so no LoRA adapters to "
            "merge. Apply "
            "onnxblocks.peft.apply_lora first."
        )
    folder = Path(os.fspath(base_dir)) if base_dir is not None else None
    stored = {t.name: t for t in model.graph.initializer}
    own = dict(adapters or {})

    def value_of(name: str) -> np.ndarray:
        if name in own:
            return np.asarray(own[name])
        if name not in stored:
            raise UnknownNameError(
                f"merge_lora: no value for '{name}'; pass it in adapters={{...}}."
            )
        return numpy_helper.to_array(stored[name], os.fspath(folder) if folder else "")

    import onnx_ir as ir

    from onnxblocks.ir import serde

    work = serde.from_proto(model)
    for target in strip_adapter_branches(work, info):
        merged = fold(
            value_of(target.weight),
            value_of(target.lora_A),
            value_of(target.lora_B),
            target.scale_value,
            target.weight_layout,
        )
        work.graph.initializers[target.weight].const_value = ir.tensor(merged, name=target.weight)
    return serde.to_proto(work)
