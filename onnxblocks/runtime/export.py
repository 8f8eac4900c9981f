"""Exporting an inference model from a training session's eval model and current parameters.

Both backends export the same way: the eval model (read without its external
data) is cut down to the nodes that compute the asked outputs, its parameter
inputs become initializers, and :func:`onnxblocks.io.save_model` streams the
trained values (fetched one parameter at a time) and the eval model's own
constants into the destination. The result is self-contained: a single
``.onnx`` file when the weights total less than :data:`EXTERNAL_DATA_FROM`
bytes, else the ``.onnx`` file and ``<file name>.data`` beside it, referenced
by a relative location. Nothing refers back to the artifacts directory, and
models over 2 GB work (no tensor ever sits inside a protobuf message).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxblocks._core import weights as _weights
from onnxblocks._core.contracts import (
    FORWARD_OUTPUTS_METADATA,
    LORA_METADATA,
    PORTABLE_METADATA,
    PORTABLE_MODE_METADATA,
)
from onnxblocks._core.errors import InvalidValueError
from onnxblocks.io import load_model

if TYPE_CHECKING:
    from onnxblocks.peft.info import LoraInfo, LoraTarget

#: Exports whose weights total at least this many bytes keep them in ``<file name>.data`` beside the
#: model.
EXTERNAL_DATA_FROM = 1 << 30


def inference_model(
    eval_model: onnx.ModelProto,
    parameters: Mapping[str, tuple[int, Sequence[int]]],
    outputs: Sequence[str],
    eval_outputs: Sequence[str],
    lora: LoraInfo | None = None,
) -> tuple[onnx.ModelProto, list[LoraTarget]]:
    """The eval model cut down to ``outputs``, with the parameters it reads as held stubs.

    Inputs that no kept node reads (the labels the loss used) are dropped; the
    parameters (``name -> (ONNX data type, dims)``) that kept nodes read become
    initializers whose bytes are held aside (:func:`onnxblocks._core.weights.make_stub`),
    to be streamed by :func:`onnxblocks.io.save_model`. ``eval_model`` is not changed.

    With ``lora`` (the model's LoRA record), the adapter branches are removed
    (:func:`onnxblocks.peft.merge.strip_adapter_branches`) and each adapted layer's weight
    becomes a held stub too, for the caller to stream merged (``W + scale * B @ A``).

    Returns:
        The model, and the LoRA targets whose weights are to be merged (empty without ``lora``).

    Raises:
        ValueError: for an output name the eval model does not compute.
    """
    import onnx_ir as ir  # the IR is loaded when exporting, not with the session

    from onnxblocks.ir import serde
    from onnxblocks.ir.edit import cut_to_outputs, values_by_name

    model = serde.from_proto(eval_model)
    graph = model.graph
    values = values_by_name(graph)
    unknown = [n for n in outputs if n not in values]
    if unknown:
        raise InvalidValueError(
            f"Cannot export outputs {unknown}: the eval model computes no such value. Eval model "
            "outputs: "
            f"{list(eval_outputs)}; any value of the eval graph can be exported."
        )
    cut_to_outputs(graph, [values[n] for n in outputs])
    for value in list(
        graph.inputs
    ):  # the parameters it reads become held initializers, after the constants
        name = value.name or ""
        if name in parameters:
            data_type, dims = parameters[name]
            graph.inputs.remove(value)
            graph.initializers.pop(name, None)
            value.const_value = ir.serde.deserialize_tensor(
                _weights.make_stub(name, data_type, list(dims))
            )
            graph.initializers[name] = value
    merged: list[LoraTarget] = []
    if lora is not None:
        from onnxblocks.peft.merge import strip_adapter_branches

        merged = strip_adapter_branches(model, lora)
        for target in merged:  # the merged weight is streamed like a parameter
            value = graph.initializers[target.weight]
            tensor = value.const_value
            assert tensor is not None  # an initializer (a parameter's stub, or a frozen constant)
            dims = [int(d) for d in tensor.shape.numpy()]
            value.const_value = ir.serde.deserialize_tensor(
                _weights.make_stub(target.weight, int(tensor.dtype), dims)
            )
    graph.name = graph.name or "inference"
    graph.doc_string = None
    model.producer_name = eval_model.producer_name
    model.producer_version = model.domain = model.model_version = model.doc_string = None
    model.metadata_props.pop(PORTABLE_METADATA, None)
    model.metadata_props.pop(PORTABLE_MODE_METADATA, None)
    untyped = [v for v in graph.outputs if v.type is None]
    if untyped:
        inferred = onnx.shape_inference.infer_shapes(serde.to_proto(model)).graph.value_info
        infos = {info.name: info for info in inferred}
        for value in untyped:
            info = infos.get(value.name or "")
            if info is not None and info.HasField("type"):
                value.type = ir.serde.deserialize_type_proto_for_type(info.type)
                value.shape = ir.serde.deserialize_type_proto_for_shape(info.type)
            else:
                value.type = ir.TensorType(ir.DataType.UNDEFINED)
    return serde.to_proto(model), merged


def export_inference(
    eval_model: Path,
    destination: Path,
    names: Sequence[str],
    parameters: Mapping[str, tuple[np.dtype, Sequence[int]]],
    fetch: Callable[[str], np.ndarray],
    eval_outputs: Sequence[str],
    merge_adapters: bool = False,
) -> Path:
    """Write the inference model cut from ``eval_model`` with the parameters ``fetch`` returns.

    Args:
        eval_model: The artifacts' eval model (``.onnx``; its external data is read from beside it).
        destination: The ``.onnx`` file to write; its data file, when it needs one, is
            ``<destination name>.data`` beside it. Both appear complete or not at all.
        names: The outputs to keep.
        parameters: ``name -> (dtype, shape)`` of every parameter the session holds.
        fetch: Returns a parameter's current value; called once per parameter the
            export keeps, while its bytes are written (one parameter in memory at a time).
        eval_outputs: The eval model's outputs, for the error message.
        merge_adapters: Fold the LoRA adapters into their base weights (``W + scale * B @ A``, in
        the
            weight's layout and dtype) and remove the adapter branches (docs/lora.md).

    Returns:
        ``destination``.

    Raises:
        ValueError: if ``names`` is empty or names a value the eval model does not
            compute, the eval model is an ORT-format file, or ``merge_adapters`` is asked
            of a model without LoRA adapters.
    """
    from onnxblocks.io import save_model

    names = list(names)
    if not names:
        raise InvalidValueError(
            "export_inference_model: cannot tell which outputs the inference model should have. "
            "Pass "
            "output_names=[...] (e.g. the forward model's outputs), or generate the artifacts with "
            "additional_output_names=[...]."
        )
    if eval_model.suffix != ".onnx":
        raise InvalidValueError(
            f"Cannot export from the ORT-format eval model '{eval_model}': keep the .onnx file."
        )
    model = load_model(eval_model)
    specs = {
        n: (helper.np_dtype_to_tensor_dtype(np.dtype(d)), tuple(s))
        for n, (d, s) in parameters.items()
    }
    from onnxblocks.peft.info import (
        lora_info,
    )  # the LoRA record and merge are loaded only when merging

    lora = lora_info(model) if merge_adapters else None
    if merge_adapters and lora is None:
        raise InvalidValueError(
            f"export_inference_model(merge_adapters=True): the eval model '{eval_model}' has no "
            "LoRA adapters "
            f"('{LORA_METADATA}' metadata). Generate the artifacts with lora=LoraConfig(...), or "
            "export without "
            "merge_adapters."
        )
    cut, merged = inference_model(model, specs, names, eval_outputs, lora)
    if merged:
        fetch = _merging_fetch(fetch, merged, model, specs, eval_model.parent)
        for target in merged:
            stub = next(t for t in cut.graph.initializer if t.name == target.weight)
            specs[target.weight] = (stub.data_type, tuple(stub.dims))
    total = sum(_weights.tensor_nbytes(t) for t in cut.graph.initializer)
    # a frozen base in base_weights.bin is inlined too below the limit: Transformers.js in the
    # browser cannot load a model's external data file
    external = total >= EXTERNAL_DATA_FROM
    sources: dict[str, _weights.TensorSource] = {}
    for index, init in enumerate(cut.graph.initializer):
        if not _weights.is_stub(init):
            if not external and init.data_location == TensorProto.EXTERNAL:
                array = numpy_helper.to_array(init, base_dir=os.fspath(eval_model.parent))
                cut.graph.initializer[index].CopyFrom(numpy_helper.from_array(array, init.name))
            continue
        if external:
            data_type, dims = specs[init.name]
            sources[init.name] = _weights.TensorSource(
                init.name, data_type, dims, load=functools.partial(fetch, init.name)
            )
        else:  # one self-contained file
            cut.graph.initializer[index].CopyFrom(
                numpy_helper.from_array(fetch(init.name), init.name)
            )
    threshold = 1024 if external else 1 << 62
    destination.parent.mkdir(parents=True, exist_ok=True)
    written = save_model(
        cut, destination, sources, external_data_threshold=threshold, base_dir=eval_model.parent
    )
    stale = destination.with_name(destination.name + ".data")
    if written == destination and stale.is_file():
        stale.unlink()  # an earlier export's data file: the new model does not read it
    return destination


def _merging_fetch(
    fetch: Callable[[str], np.ndarray],
    targets: Sequence[LoraTarget],
    model: onnx.ModelProto,
    parameters: Mapping[str, tuple[int, Sequence[int]]],
    base_dir: Path,
) -> Callable[[str], np.ndarray]:
    """``fetch``, but a merged layer's weight comes back as ``W + scale * B @ A`` (W: a parameter
    or a constant).
    """
    from onnxblocks.peft.merge import fold

    by_weight = {t.weight: t for t in targets}
    held = frozenset(parameters)  # before the merge: the caller adds the merged constants' specs
    constants = {
        t.name: t for t in model.graph.initializer if t.name in by_weight and t.name not in held
    }

    def merged_fetch(name: str) -> np.ndarray:
        target = by_weight.get(name)
        if target is None:
            return fetch(name)
        base = (
            fetch(name)
            if name in held
            else numpy_helper.to_array(constants[name], os.fspath(base_dir))
        )
        return fold(
            base,
            fetch(target.lora_A),
            fetch(target.lora_B),
            target.scale_value,
            target.weight_layout,
        )

    return merged_fetch


def forward_outputs_hint(eval_model: Path | None) -> list[str]:
    """Forward output names recorded in the eval model's metadata (``onnxblocks.forward_outputs``),
    if any.

    The value is a JSON list of names, or a comma-separated list.
    """
    if eval_model is None or eval_model.suffix != ".onnx":
        return []
    model = load_model(eval_model)
    return forward_outputs_of({p.key: p.value for p in model.metadata_props})


def forward_outputs_of(metadata: Mapping[str, str]) -> list[str]:
    """The forward output names a model's metadata records (see :func:`forward_outputs_hint`)."""
    value = metadata.get(FORWARD_OUTPUTS_METADATA)
    if value is None:
        return []
    try:
        names = json.loads(value)
    except ValueError:
        names = [n for n in value.split(",") if n]
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return names
    return []
