"""The quantized files of a hub folder, as Transformers.js loads them by ``dtype``.

* ``q8`` -> ``onnx/model_quantized.onnx``: dynamic int8, each float MatMul with a constant weight
  becomes ``DynamicQuantizeLinear`` + ``MatMulInteger`` (uint8 weights, one scale per tensor),
  written by ONNX Runtime's own ``quantize_dynamic`` (through :mod:`onnxblocks._core.ort`).
* ``q4`` -> ``onnx/model_q4.onnx``: each float MatMul ``X @ W`` with a constant 2-D weight becomes
  ``com.microsoft.MatMulNBits`` (bits 4, blocks of 32 along K, symmetric: the default zero point
  8, no zero-point input). The training build of ONNX Runtime lacks the C quantizer its Python
  helper calls, so the packing is done here in numpy: ``B`` is ``uint8 [N, K/32, 16]`` (two values
  a byte, the even index in the low nibble), ``scales`` float ``[N * K/32]``; the kernel computes
  ``W[k, n] = (q - 8) * scale``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core import ort as _ort
from onnxblocks.ir.edit import add_initializer, replace_node
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.serde import from_proto, to_proto

__all__ = ["Q4_BLOCK", "QUANTIZED_FILES", "quantize_q4", "quantize_q8", "q4_weight"]

#: ``quantize`` option -> the file name Transformers.js loads for it (``dtype: "q8"`` / ``"q4"``).
QUANTIZED_FILES = {"q8": "model_quantized.onnx", "q4": "model_q4.onnx"}
#: Block length along K of the 4-bit file (Transformers.js's own exports use 32).
Q4_BLOCK = 32
_MS = "com.microsoft"


def quantize_q8(source: Path, target: Path, external: bool = False) -> Path:
    """Write the dynamic int8 form of the model ``source`` to ``target`` (with ``external``: its
    weights in external data beside it, for a model over protobuf's 2 GiB).
    """
    quantization = _ort.quantization()
    quantization.quantize_dynamic(
        os.fspath(source),
        os.fspath(target),
        op_types_to_quantize=["MatMul"],
        weight_type=quantization.QuantType.QUInt8,
        use_external_data_format=external,
    )
    return target


def q4_weight(weight: np.ndarray, block: int = Q4_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """A ``[K, N]`` float weight as MatMulNBits' ``(B uint8 [N, K/block, block/2], scales)``.

    Symmetric per block: ``scale = max|w| / 7``, ``q = clip(round(w / scale) + 8, 0, 15)``; K is
    padded with zeros to a whole block.
    """
    k, n = weight.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), dtype=np.float32)
    padded[:k] = weight.astype(np.float32)
    columns = padded.T.reshape(n, blocks, block)
    scales = np.abs(columns).max(axis=2) / 7.0
    safe = np.where(scales == 0, 1.0, scales)
    q = np.clip(np.rint(columns / safe[..., None]) + 8, 0, 15).astype(np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    return packed, scales.astype(np.float32).reshape(-1)


def quantize_q4(model: onnx.ModelProto, block: int = Q4_BLOCK) -> onnx.ModelProto:
    """A copy of ``model`` (weights loaded) whose MatMuls with a constant 2-D float32 weight are
    4-bit ``MatMulNBits``; ``model`` is not changed.
    """
    working = from_proto(model)
    graph = working.graph
    done: dict[str, tuple[ir.Value, ir.Value, int, int]] = {}
    for node in list(graph):
        weight = node.inputs[1] if node.op_type == "MatMul" and len(node.inputs) == 2 else None
        name = weight.name if weight is not None else None
        if (
            weight is None
            or name is None
            or node.domain not in ("", "ai.onnx")
            or graph.initializers.get(name) is not weight
            or weight.const_value is None
            or weight.const_value.dtype != ir.DataType.FLOAT
            or len(weight.const_value.shape) != 2
        ):
            continue
        if name not in done:
            k, n = weight.const_value.shape.numpy()
            packed, scales = q4_weight(weight.const_value.numpy(), block)
            b = add_initializer(graph, graph_names(graph).fresh(f"{name}_Q4"), packed)
            s = add_initializer(graph, graph_names(graph).fresh(f"{name}_scales"), scales)
            done[name] = (b, s, k, n)
        b, s, k, n = done[name]
        attributes = {"K": k, "N": n, "bits": 4, "block_size": block}
        nbits = ir.node(
            "MatMulNBits", [node.inputs[0], b, s], attributes, domain=_MS, name=node.name
        )
        replace_node(node, [nbits], list(nbits.outputs))
    for name in done:
        if not graph.initializers[name].uses():
            graph.initializers.pop(name)
    if done:
        working.opset_imports.setdefault(_MS, 1)
    return to_proto(working)
