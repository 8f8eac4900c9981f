"""Tensors across the border: torch CPU tensors to ONNX Runtime ``OrtValue`` and back, without
copies.

Both directions go through DLPack, which shares the memory: a torch tensor fed
to ONNX Runtime is read in place, and an ``OrtValue`` that ONNX Runtime wrote
becomes a torch tensor that owns it. Two exceptions copy: a non-contiguous
tensor is made contiguous first (ONNX Runtime reads dense tensors only), and a
bool ``OrtValue`` arrives as uint8 through DLPack in onnxruntime 1.19.2 and is
converted.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch

from onnxblocks._core.ort import capi

__all__ = [
    "ONNX_OF_TORCH",
    "TORCH_OF_ONNX",
    "new_vector",
    "onnx_type_name",
    "push",
    "to_torch",
]

#: ONNX element type of each torch dtype that ONNX Runtime's CPU kernels take.
ONNX_OF_TORCH: dict[torch.dtype, int] = {
    torch.float32: onnx.TensorProto.FLOAT,
    torch.float64: onnx.TensorProto.DOUBLE,
    torch.float16: onnx.TensorProto.FLOAT16,
    torch.bfloat16: onnx.TensorProto.BFLOAT16,
    torch.int64: onnx.TensorProto.INT64,
    torch.int32: onnx.TensorProto.INT32,
    torch.int16: onnx.TensorProto.INT16,
    torch.int8: onnx.TensorProto.INT8,
    torch.uint8: onnx.TensorProto.UINT8,
    torch.bool: onnx.TensorProto.BOOL,
}
TORCH_OF_ONNX: dict[int, torch.dtype] = {v: k for k, v in ONNX_OF_TORCH.items()}


def onnx_type_name(elem_type: int) -> str:
    """``float``, ``int64``... for an ONNX element type."""
    return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "unknown"


_to_dlpack = (
    torch._C._to_dlpack
)  # what torch.utils.dlpack calls, without the Python frame (once per tensor)
_from_dlpack = torch._C._from_dlpack


@functools.cache
def _capi() -> Any:
    return capi()


def push(vector: Any, tensor: torch.Tensor) -> None:
    """Append ``tensor`` (CPU) to an ``OrtValueVector`` without copying it (unless it is not
    contiguous).
    """
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.dtype == torch.bool:
        vector.push_back(_to_dlpack(tensor.detach().view(torch.uint8)), True)
    else:
        vector.push_back(_to_dlpack(tensor.detach()), False)


def new_vector() -> Any:
    """An empty ``OrtValueVector``."""
    return _capi().OrtValueVector()


def vector_of(tensors: Sequence[torch.Tensor]) -> Any:
    """A new ``OrtValueVector`` holding ``tensors``."""
    vector = _capi().OrtValueVector()
    vector.reserve(len(tensors))
    for tensor in tensors:
        push(vector, tensor)
    return vector


def ortvalue_of(array: np.ndarray) -> Any:
    """An ``OrtValue`` that owns a copy of ``array`` (constants fed to both halves of a split
    graph).
    """
    vector = vector_of([torch.from_numpy(np.array(array, copy=True))])
    return vector[0]


def to_torch(vector: Any, index: int) -> torch.Tensor:
    """The ``OrtValue`` at ``index`` of an ``OrtValueVector`` as a torch tensor sharing its
    memory.
    """
    tensor = _from_dlpack(vector.dlpack_at(index))
    if vector.element_type_at(index) == onnx.TensorProto.BOOL:
        tensor = tensor.to(torch.bool)
    return tensor
