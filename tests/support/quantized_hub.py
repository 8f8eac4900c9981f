"""Quantized variants of a tiny LLaMA as the Hub has them, made by ONNX Runtime's own quantizers.

The float model is exported as Optimum exports (TorchScript, constant folding on: each Linear's
weight an ``[in, out]`` initializer ``onnx::MatMul_N``, the node named after the module).
``model_quantized.onnx`` comes from ``onnxruntime.quantization.quantize_dynamic`` (int8 weights,
``DynamicQuantizeLinear`` + ``MatMulInteger``), in this venv. ``MatMulNBitsQuantizer`` cannot run
in onnxruntime-training 1.19.2 (its ``quantize_matmul_4bits`` kernel binding is missing), so
``model_q4.onnx`` (``MatMulNBits``, 4-bit, block 32, with zero points) and its QDQ form
(``DequantizeLinear`` + ``MatMul``; the float model converted to opset 21 first, as the quantizer
only stamps the opset) come from stock onnxruntime in the cached Python 3.13 venv
(:mod:`support.portable_env`).

:func:`dequantized_weights` is the tests' own reading of the quantized files (NumPy, from the
contrib op's and the ONNX spec's definitions): module path -> the float ``[out, in]`` weight.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from support import hf_families
from support.torch_export import export_onnx

_QUANTIZE_4BIT = """
import sys, onnx
from onnx import version_converter
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization import matmul_nbits_quantizer as m
src, q4, qdq = sys.argv[1:4]
for fmt, out in ((QuantFormat.QOperator, q4), (QuantFormat.QDQ, qdq)):
    model = onnx.load(src)
    if fmt == QuantFormat.QDQ:
        model = version_converter.convert_version(model, 21)
    cfg = m.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, quant_format=fmt)
    quantizer = m.MatMulNBitsQuantizer(model, algo_config=cfg)
    quantizer.process()
    quantizer.model.save_model_to_file(out)
"""


def llama_family() -> hf_families.Family:
    """A tiny LLaMA (hidden 64, intermediate 128, vocabulary 128: rows of two blocks of 32)."""
    torch.manual_seed(0)
    model = hf_families.decoder_lm("llama", vocab_size=128, hidden_size=64, intermediate_size=128)
    model.set_attn_implementation("eager")
    rng = np.random.default_rng(0)
    inputs = {"input_ids": rng.integers(0, 128, (2, 8)).astype(np.int64)}
    wrapped = hf_families.Logits(model, list(inputs), {"attention_mask": "input_ids"}).train()
    return hf_families.Family("llama", wrapped, inputs, rng.integers(0, 128, (2, 8)), "ce_last")


def load_weights(family: hf_families.Family, weights: dict[str, np.ndarray]) -> None:
    """Put ``dequantized_weights`` into ``family``'s torch model (rounded to float32)."""
    with torch.no_grad():
        for module, value in weights.items():
            path = "model.model.embed_tokens" if module == "<embedding>" else module
            target = family.model.get_submodule(path).weight
            target.copy_(torch.from_numpy(value.astype(np.float32)))


def export_folded(family: hf_families.Family, path: Path) -> Path:
    """``family``'s model exported as Optimum does (TorchScript, constant folding, opset 17)."""
    model = export_onnx(
        family.model, family.inputs, dynamo=False, opset=17, training=False, fold=True
    )
    onnx.save(model, path)
    return path


def quantize_int8(source: Path, out: Path) -> Path:
    """``model_quantized.onnx``: ``quantize_dynamic`` with int8 weights (this venv's onnxruntime)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its "consider pre-processing" advice
    try:
        quantize_dynamic(source, out, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    return out


def quantize_4bit(source: Path, q4: Path, qdq: Path) -> tuple[Path, Path]:
    """``model_q4.onnx`` (MatMulNBits) and its QDQ form, by stock onnxruntime's quantizer."""
    from support.portable_env import ensure_python313

    python = ensure_python313()
    # the 3.13 interpreter must not see this run's module paths (a 3.11 stdlib on PYTHONPATH
    # breaks its own imports)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    done = subprocess.run(
        [os.fspath(python), "-c", _QUANTIZE_4BIT, os.fspath(source), os.fspath(q4), os.fspath(qdq)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"MatMulNBitsQuantizer failed in {python}:\n{done.stderr[-4000:]}"
    return q4, qdq


def _unpack_uint4(raw: np.ndarray, count: int) -> np.ndarray:
    flat = raw.reshape(-1)
    return np.stack([flat & 0x0F, flat >> 4], axis=-1).reshape(-1)[:count].astype(np.int64)


def _module(node: onnx.NodeProto) -> str:
    return ".".join(node.name.split("/")[1:-1])


def _after(model: onnx.ModelProto, value: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if value in n.input)


def dequantized_weights(path: Path) -> dict[str, np.ndarray]:
    """Module path -> the layer's float weight ``[out, in]`` as the quantized file defines it
    (float64), and ``"<embedding>"`` -> the embedding table where ``quantize_dynamic`` quantized
    its ``Gather``.
    """
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    raw = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    out: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
            blocks = -(-k // block)
            packed = np.frombuffer(raw[node.input[1]].raw_data, np.uint8)
            q = _unpack_uint4(packed, n * blocks * block)
            scales = inits[node.input[2]].reshape(n, blocks).astype(np.float64)
            zp_bytes = np.frombuffer(raw[node.input[3]].raw_data, np.uint8).reshape(n, -1)
            zp = _unpack_uint4(zp_bytes, zp_bytes.size * 2).reshape(n, -1)[:, :blocks]
            w = (q.reshape(n, blocks, block) - zp[..., None]) * scales[..., None]
            out[_module(node)] = w.reshape(n, blocks * block)[:, :k]
        elif node.op_type == "MatMulInteger":
            q = inits[node.input[1]].astype(np.int64)
            zp = inits[node.input[3]].astype(np.int64) if len(node.input) > 3 else 0
            cast = _after(model, node.output[0])
            mul = _after(model, cast.output[0])
            scales = producers[next(i for i in mul.input if i != cast.output[0])]
            w_scale = next(inits[i] for i in scales.input if i in inits)
            out[_module(node)] = ((q - zp) * w_scale.astype(np.float64)).T
        elif node.op_type == "DequantizeLinear" and node.input[0] in raw:  # the QDQ form
            init, zp_init = raw[node.input[0]], raw[node.input[2]]
            kk, nn = init.dims
            block = next(a.i for a in node.attribute if a.name == "block_size")
            q = _unpack_uint4(np.frombuffer(init.raw_data, np.uint8), kk * nn).reshape(kk, nn)
            zp = _unpack_uint4(np.frombuffer(zp_init.raw_data, np.uint8), kk * nn // block)
            zp = np.repeat(zp.reshape(-1, nn), block, axis=0)
            scales = np.repeat(inits[node.input[1]].astype(np.float64), block, axis=0)
            out[_module(_after(model, node.output[0]))] = ((q - zp) * scales).T
        elif node.op_type == "DequantizeLinear":  # quantize_dynamic's embedding: a Gather of int8
            gather = producers[node.input[0]]
            q = inits[gather.input[0]].astype(np.int64)
            scale, zp = inits[node.input[1]], inits[node.input[2]].astype(np.int64)
            out["<embedding>"] = (q - zp) * scale.astype(np.float64)
    return out
