"""merge_lora: W + scale * B @ A folded in, the adapter branch removed, the outputs unchanged (onnxruntime).

The graphs here are written by hand in the form the contract describes (the layer's output plus
``x @ A^T @ B^T * scale``), for each way a base weight can be stored: ``[in, out]`` under a
MatMul, ``[out, in]`` under a Gemm with ``transB`` (and a bias) or behind a Transpose, float16
behind a Cast, and a join that is the graph's output.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.numerics import assert_close

from onnxblocks._core.contracts import LORA_METADATA
from onnxblocks.errors import InvalidTypeError, InvalidValueError
from onnxblocks.peft import LoraConfig, LoraInfo, LoraTarget
from onnxblocks.peft.merge import fold, merge_lora

IN, OUT, R, ALPHA = 6, 5, 2, 4


def _model(kind: str, seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    """``x -> layer(W) + x @ A^T @ B^T * s -> Relu`` (``Relu`` left out for kind "output")."""
    rng = np.random.default_rng(seed)
    w_out_in = rng.standard_normal((OUT, IN)).astype(np.float32)
    a = rng.standard_normal((R, IN)).astype(np.float32)
    b = rng.standard_normal((OUT, R)).astype(np.float32)
    nodes, inits = [], []
    layout = "out_in"
    if kind == "matmul_in_out" or kind == "output":
        layout = "in_out"
        inits.append(numpy_helper.from_array(w_out_in.T.copy(), "W"))
        nodes.append(helper.make_node("MatMul", ["x", "W"], ["y"], name="layer"))
    elif kind == "gemm_transb":
        inits += [
            numpy_helper.from_array(w_out_in, "W"),
            numpy_helper.from_array(np.ones(OUT, np.float32), "bias"),
        ]
        nodes.append(helper.make_node("Gemm", ["x", "W", "bias"], ["y"], name="layer", transB=1))
    elif kind == "transpose":
        inits.append(numpy_helper.from_array(w_out_in, "W"))
        nodes += [
            helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "Wt"], ["y"], name="layer"),
        ]
    elif kind == "fp16":
        inits.append(numpy_helper.from_array(w_out_in.astype(np.float16), "W"))
        nodes += [
            helper.make_node("Cast", ["W"], ["W32"], to=TensorProto.FLOAT),
            helper.make_node("Gemm", ["x", "W32"], ["y"], name="layer", transB=1),
        ]
    inits += [
        numpy_helper.from_array(a, "layer.lora_A.weight"),
        numpy_helper.from_array(b, "layer.lora_B.weight"),
        numpy_helper.from_array(np.array(ALPHA / R, np.float32), "scale"),
    ]
    out = "z" if kind == "output" else "sum"
    nodes += [
        helper.make_node("Transpose", ["layer.lora_A.weight"], ["At"], perm=[1, 0]),
        helper.make_node("Transpose", ["layer.lora_B.weight"], ["Bt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "At"], ["xa"]),
        helper.make_node("MatMul", ["xa", "Bt"], ["xab"]),
        helper.make_node("Mul", ["xab", "scale"], ["branch"]),
        helper.make_node("Add", ["y", "branch"], [out]),
    ]
    if kind != "output":
        nodes.append(helper.make_node("Relu", ["sum"], ["z"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, IN])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, OUT])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    target = LoraTarget(
        module="layer",
        weight="W",
        weight_layout=layout,
        node="layer",
        in_features=IN,
        out_features=OUT,
        lora_A="layer.lora_A.weight",
        lora_B="layer.lora_B.weight",
        scale_value=ALPHA / R,
    )
    info = LoraInfo(
        config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["layer"]),
        targets={"layer": target},
    )
    helper.set_model_props(model, {LORA_METADATA: info.to_json()})
    return model, rng.standard_normal((3, IN)).astype(np.float32)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", ["matmul_in_out", "gemm_transb", "transpose", "fp16", "output"])
def test_merge_keeps_the_outputs_and_removes_the_branch(kind):
    model, x = _model(kind)
    before = model.SerializeToString()
    merged = merge_lora(model)
    assert model.SerializeToString() == before  # the caller's model is not changed
    onnx.checker.check_model(merged)
    names = {t.name for t in merged.graph.initializer}
    assert not names & {"layer.lora_A.weight", "layer.lora_B.weight", "scale"}
    assert [n.op_type for n in merged.graph.node].count("MatMul") + [
        n.op_type for n in merged.graph.node
    ].count("Gemm") == 1
    assert LORA_METADATA not in {p.key for p in merged.metadata_props}
    assert [o.name for o in merged.graph.output] == ["z"]
    weight = next(t for t in merged.graph.initializer if t.name == "W")
    assert weight.data_type == next(t for t in model.graph.initializer if t.name == "W").data_type
    (expected, _), (expected64, terms) = (
        _reference(model, x, kind, dtype) for dtype in (np.float32, np.float64)
    )
    # against the unmerged model, whose output ONNX Runtime computes in another order: rtol 1e-5
    # (the float16 base rounds the merged weight once: there the reference is the model with that weight)
    assert_close(
        _run(merged, x),
        _run(model, x) if kind != "fp16" else expected,
        expected64,
        rtol=1e-5,
        scale=terms,
    )


def _reference(
    model: onnx.ModelProto, x: np.ndarray, kind: str, dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The model's output in NumPy's ``dtype`` and the sum of |terms| of each element (before Relu); for
    "fp16", with the adapters folded into the float16 weight (rounded once) as the merge stores it."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    a, b, scale = values["layer.lora_A.weight"], values["layer.lora_B.weight"], values["scale"]
    w = values["W"].T if kind in ("matmul_in_out", "output") else values["W"]  # as [out, in]
    if kind == "fp16":
        w = (w.astype(np.float32) + scale * (b @ a)).astype(np.float16)
        a, b = np.zeros_like(a), np.zeros_like(b)
    w, a, b, x = (v.astype(dtype) for v in (w, a, b, x))
    bias, scale = values.get("bias", np.zeros(OUT)).astype(dtype), dtype(scale)
    total = x @ w.T + bias + scale * (x @ a.T) @ b.T
    terms = np.abs(x) @ np.abs(w.T) + np.abs(bias) + scale * (np.abs(x) @ np.abs(a.T)) @ np.abs(b.T)
    return (total if kind == "output" else np.maximum(total, 0)), terms


def test_merge_with_given_adapters_and_refusals():
    model, _ = _model("matmul_in_out")
    zeros = {
        "layer.lora_A.weight": np.zeros((R, IN), np.float32),
        "layer.lora_B.weight": np.zeros((OUT, R), np.float32),
    }
    plain = merge_lora(model, zeros)
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "W"))
    np.testing.assert_array_equal(
        numpy_helper.to_array(next(t for t in plain.graph.initializer if t.name == "W")), w
    )
    with pytest.raises(InvalidTypeError, match="ModelProto"):
        merge_lora(b"model")  # type: ignore[arg-type]
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.metadata_props[:]
    with pytest.raises(InvalidValueError, match="no 'onnxblocks.lora' metadata"):
        merge_lora(bare)


def test_fold_layouts_and_dtypes():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((OUT, IN)).astype(np.float32)
    a = rng.standard_normal((R, IN)).astype(np.float32)
    b = rng.standard_normal((OUT, R)).astype(np.float32)
    want = w + 2.0 * b @ a
    w64, a64, b64 = (v.astype(np.float64) for v in (w, a, b))
    want64, terms = w64 + 2.0 * b64 @ a64, np.abs(w64) + 2.0 * np.abs(b64) @ np.abs(a64)
    assert_close(fold(w, a, b, 2.0, "out_in"), want, want64, rtol=1e-6, scale=terms, name="out_in")
    assert_close(
        fold(w.T.copy(), a, b, 2.0, "in_out"),
        want.T,
        want64.T,
        rtol=1e-6,
        scale=terms.T,
        name="in_out",
    )
    w16 = w.astype(np.float16)
    half = fold(w16, a, b, 2.0, "out_in")
    assert half.dtype == np.float16
    np.testing.assert_array_equal(
        half, (w16.astype(np.float32) + 2.0 * b @ a).astype(np.float16)
    )  # rounded once
    with pytest.raises(InvalidValueError, match=r"\[5, 6\]"):
        fold(w.T.copy(), a, b, 2.0, "out_in")
