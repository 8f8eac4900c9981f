"""The trained inference model the browser page offers: an ONNX file written at generation time,
filled in the page.

:func:`write_inference_template` exports the artifacts' inference model (the eval
model cut to the wanted outputs, the parameters as initializers) and writes beside
it a layout, ``<model>.json``: where each parameter's bytes lie in the ``.onnx``
file. The JavaScript client's ``fillInferenceModel`` (``js/src/inference.mjs``)
copies the file and overwrites those bytes with the trained values, so the page
downloads a self-contained ``.onnx`` that any ONNX Runtime runs, with no protobuf
code in the browser. Layout (``format`` ``onnxblocks-inference-template/1``)::

    {"format": ..., "model": "inference_model.onnx", "outputs": ["logits"],
     "inputs": ["x"], "tensors": [{"name", "dtype", "shape", "offset", "length"}, ...]}

``dtype`` is the ONNX Runtime JavaScript name (``float32``...); ``offset`` and
``length`` locate the tensor's little-endian ``raw_data`` in the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from onnxblocks._core.errors import InvalidValueError

#: The layout's ``format``.
TEMPLATE_FORMAT = "onnxblocks-inference-template/1"
#: The file name of the template in the artifact folder.
INFERENCE_MODEL = "inference_model.onnx"
#: numpy dtype -> ONNX Runtime JavaScript dtype name.
_JS_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.float16): "float16",
    np.dtype(np.int8): "int8",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.int16): "int16",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.int32): "int32",
    np.dtype(np.uint32): "uint32",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint64): "uint64",
    np.dtype(np.bool_): "bool",
}


def _marker(name: str, length: int) -> bytes:
    """``length`` bytes derived from ``name``: found once in the serialized model, where the
    tensor's bytes are.
    """
    stream = b""
    counter = 0
    while len(stream) < length:
        stream += hashlib.sha256(f"{name}\0{counter}".encode()).digest()
        counter += 1
    return stream[:length]


def write_inference_template(
    artifacts: str | os.PathLike[str], output_names: Sequence[str], filename: str = INFERENCE_MODEL
) -> Path:
    """Export the inference model of ``artifacts`` (initial weights) and its layout
    ``<filename>.json`` beside it.

    Args:
        artifacts: A portable artifact folder with an eval model.
        output_names: The outputs the inference model keeps (e.g. ``["logits"]``).
        filename: The model's file name in ``artifacts``.

    Returns:
        The layout's path.

    Raises:
        InvalidValueError: when a parameter's bytes cannot be located (a tensor of 0 bytes or an
        unusual dtype).
    """
    from onnxblocks.runtime import TrainingSession

    folder = Path(os.fspath(artifacts))
    path = folder / filename
    session = TrainingSession(folder)
    session.export_inference_model(path, list(output_names))
    parameters = set(session.parameter_names())
    del session
    model = onnx.load(os.fspath(path))
    originals: dict[str, np.ndarray] = {}
    for index, init in enumerate(model.graph.initializer):
        if init.name not in parameters:
            continue
        array = numpy_helper.to_array(init)
        if array.dtype not in _JS_DTYPES or array.nbytes == 0:
            raise InvalidValueError(
                f"Cannot lay out parameter '{init.name}' ({array.dtype}, {array.nbytes} bytes) "
                "for the browser's "
                "inference model: only non-empty tensors of the safetensors dtypes are filled in "
                "the page."
            )
        originals[init.name] = np.ascontiguousarray(array)
        marked = numpy_helper.from_array(array, init.name)
        marked.raw_data = _marker(init.name, array.nbytes)
        model.graph.initializer[index].CopyFrom(marked)
    marked_bytes = model.SerializeToString()
    tensors = []
    for name, array in originals.items():
        marker = _marker(name, array.nbytes)
        offset = marked_bytes.find(marker)
        if offset < 0 or marked_bytes.find(marker, offset + 1) >= 0:
            raise InvalidValueError(
                f"Cannot locate parameter '{name}' in the inference model's bytes uniquely."
            )
        tensors.append(
            {
                "name": name,
                "dtype": _JS_DTYPES[array.dtype],
                "shape": list(array.shape),
                "offset": offset,
                "length": array.nbytes,
            }
        )
    filled = bytearray(marked_bytes)
    for entry in tensors:
        array = originals[str(entry["name"])]
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        filled[int(entry["offset"]) : int(entry["offset"]) + len(raw)] = raw
    path.write_bytes(bytes(filled))
    layout = {
        "format": TEMPLATE_FORMAT,
        "model": filename,
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
        "tensors": tensors,
    }
    target = folder / f"{filename}.json"
    target.write_text(json.dumps(layout, indent=1) + "\n", encoding="utf-8")
    return target
