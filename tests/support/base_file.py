"""The tests' own reading of an artifact directory's quantized base (``base_weights.bin``).

Each quantized initializer of the training model (int8 bytes, or int4 nibbles unpacked here) is
multiplied by its stored ``<name>.scale``, one scale per block of ``block`` elements of a row: the
weights the models compute with ``DequantizeLinear``, in NumPy, from the ONNX spec's definition.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto


def stored(directory: Path, init: onnx.TensorProto) -> np.ndarray:
    """An initializer's values as written in the artifacts' base file (int4 unpacked here)."""
    info = {e.key: e.value for e in init.external_data}
    raw = np.fromfile(
        directory / info["location"], np.uint8, int(info["length"]), offset=int(info["offset"])
    )
    count = int(np.prod(init.dims))
    if init.data_type == TensorProto.INT4:
        nibbles = np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(-1)[:count].astype(np.int8)
        return np.where(nibbles > 7, nibbles - 16, nibbles).reshape(init.dims)
    dtype = {TensorProto.INT8: np.int8, TensorProto.FLOAT: np.float32}[init.data_type]
    return raw.view(dtype).reshape(init.dims)


def dequantized_base(directory: Path, block: int) -> dict[str, np.ndarray]:
    """Each quantized base weight of ``directory`` by initializer name: ``q * scale`` per block."""
    model = onnx.load(directory / "training_model.onnx", load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    quantized = [i for i in inits.values() if i.data_type in (TensorProto.INT8, TensorProto.INT4)]
    out = {}
    for init in quantized:
        q = stored(directory, init).astype(np.float32)
        scale = stored(directory, inits[f"{init.name}.scale"])
        rows, cols = q.shape
        blocks = q.reshape(rows, cols // block, block) * scale[..., None]
        out[init.name] = blocks.reshape(rows, cols)
    return out
