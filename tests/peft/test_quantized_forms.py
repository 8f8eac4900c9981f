"""The quantized Linear forms the hub-file rewrite reads, on small hand-made graphs (no Python 3.13).

``MatMulNBits`` as the contrib op's spec writes it (docs/ContribOperators.md of onnxruntime):
``B [N, blocks, block_size / 2]`` packed low nibble first, ``scales [N * blocks]``, optional packed
uint8 ``zero_points`` (a row padded to whole bytes; default 8), ``K`` not a multiple of the block.
The rewrite (standard ``DequantizeLinear`` + float ``MatMul``) must give onnxruntime's own kernel's
forward. ``quantize_dynamic(per_channel=True)`` (uint8 weights, a zero point per output) is read
as the float activation on the dequantized weight, against NumPy in float64.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close

from onnxblocks.errors import InvalidValueError
from onnxblocks.peft.dequantize import dequantize_linears
from onnxblocks.peft.quantized import find_quantized_linears

RTOL = 1e-5


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})[0]


def _nbits_model(k: int, n: int, zero_points: bool, shared: bool, seed: int = 0):
    """Two MatMulNBits layers (``fc1``, ``fc2``); with ``shared`` they read one ``B``."""
    rng = np.random.default_rng(seed)
    block = 32
    blocks = -(-k // block)
    packed = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.05, n * blocks).astype(np.float32)
    inits = [numpy_helper.from_array(packed, "w_Q4"), numpy_helper.from_array(scales, "w_scales")]
    inputs = ["w_Q4", "w_scales"]
    if zero_points:
        zp = rng.integers(0, 256, (n, -(-blocks // 2)), dtype=np.uint8).reshape(-1)
        inits.append(numpy_helper.from_array(zp, "w_zero_points"))
        inputs.append("w_zero_points")
    second = inputs if shared else [f"{name}2" for name in inputs]
    if not shared:
        inits += [numpy_helper.from_array(numpy_helper.to_array(i), f"{i.name}2") for i in inits]
    attrs = {"K": k, "N": n, "bits": 4, "block_size": block}
    nodes = [
        helper.make_node(
            "MatMulNBits",
            ["x", *inputs],
            ["h"],
            "/m/fc1/MatMul_Q4",
            domain="com.microsoft",
            **attrs,
        ),
        helper.make_node("Slice", ["h", "zero", "k", "last"], ["hk"], "/m/Slice"),
        helper.make_node(
            "MatMulNBits",
            ["hk", *second],
            ["y"],
            "/m/fc2/MatMul_Q4",
            domain="com.microsoft",
            **attrs,
        ),
    ]
    inits += [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([k], np.int64), "k"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


@pytest.mark.parametrize(
    ("k", "zero_points", "shared"),
    [(64, True, False), (96, True, False), (80, True, True), (64, False, True)],
    ids=["two-blocks", "odd-blocks-zero-points", "k-not-a-block-multiple-shared", "no-zero-points"],
)
def test_matmulnbits_rewritten_gives_onnxruntimes_kernel(k, zero_points, shared) -> None:
    model = _nbits_model(k, 96, zero_points, shared)
    found = find_quantized_linears(model)
    assert [(q.module, q.kind, q.in_features, q.out_features) for q in found] == [
        ("m.fc1", "MatMulNBits", k, 96),
        ("m.fc2", "MatMulNBits", k, 96),
    ]
    rewritten = dequantize_linears(model)
    onnx.checker.check_model(rewritten)
    assert "MatMulNBits" not in {n.op_type for n in rewritten.graph.node}
    inits = {i.name: i for i in rewritten.graph.initializer}
    assert inits["w_Q4"].data_type == TensorProto.UINT4
    assert inits["w_Q4"].raw_data == model.graph.initializer[0].raw_data  # the bytes, kept
    x = np.random.default_rng(1).standard_normal((3, k)).astype(np.float32)
    assert_close(_run(rewritten, x), _run(model, x), rtol=RTOL)


def test_per_channel_uint8_matmulinteger_is_the_float_activation_on_the_weight(tmp_path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], "/m/proj/MatMul")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 48])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
        tmp_path / "f.onnx",
    )
    quantize_dynamic(
        tmp_path / "f.onnx", tmp_path / "q.onnx", per_channel=True, weight_type=QuantType.QUInt8
    )
    quantized = onnx.load(tmp_path / "q.onnx")
    (layer,) = find_quantized_linears(quantized)
    assert (layer.module, layer.kind, layer.bits) == ("m.proj", "MatMulInteger", 8)
    inits = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    q = inits[layer.weight].astype(np.float64)
    zp = inits[layer.weight.replace("_quantized", "_zero_point")].astype(np.float64)
    scale = inits[layer.weight.replace("_quantized", "_scale")].astype(np.float64)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    want64 = x.astype(np.float64) @ ((q - zp) * scale)
    want32 = x @ ((q - zp) * scale).astype(np.float32)
    assert_close(_run(dequantize_linears(quantized), x), want32, want64, rtol=RTOL)


def test_a_form_it_cannot_read_is_refused_naming_the_node() -> None:
    model = _nbits_model(64, 32, True, False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            node.attribute[2].i = 2  # bits
    with pytest.raises(InvalidValueError, match=r"fc1/MatMul_Q4.*bits=2.*onnx/model\.onnx"):
        dequantize_linears(model)
