"""Adam's bias corrections ``1 - beta**t`` in float32 (onnxblocks.portable.bias_correction), and no
float64 in the default portable optimizer and step graphs.

The corrections are run by stock onnxruntime and compared with NumPy float64 within 1e-6 relative,
for steps 1 to 10**6 and the betas optimizers use (0.5 to 0.9999). The graph scan covers the
optimizers of the family as ``generate_artifacts(portable=True)`` writes them: AdamW (torch and
Hugging Face modes) and SGD by default, and the torch.optim family written in float32 ops
(``exact=False``; the default ``exact=True`` rounds as torch does through float64 on purpose).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from support.numerics import assert_close

from onnxblocks import artifacts, optim
from onnxblocks._core.naming import NameAuthority
from onnxblocks._core.ort import onnxruntime
from onnxblocks.ir.serde import to_proto
from onnxblocks.portable.bias_correction import bias_corrections, float_step
from onnxblocks.portable.lowering_context import Writer

STEPS = [1, 2, 3, 10, 100, 1000, 6931, 10**5, 10**6]
BETAS = [0.5, 0.9, 0.95, 0.99, 0.999, 0.9995, 0.9999]


def _corrections(betas: list[float], steps: list[int]) -> np.ndarray:
    """The graph's corrections, ``[len(steps), len(betas)]``, run by stock onnxruntime."""
    w = Writer(NameAuthority(["step"]), 17, "bias")
    step = ir.Value(name="step", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]))
    outs = bias_corrections(w, betas, float_step(w, step))
    for i, out in enumerate(outs):
        w.op("Identity", [out], f"c{i}").type = ir.TensorType(ir.DataType.FLOAT)
    values = {v.name: v for n in w.nodes for v in n.outputs}
    outputs = [values[f"c{i}"] for i in range(len(betas))]
    for v in outputs:
        v.shape = ir.Shape([])
    graph = ir.Graph([step], outputs, nodes=w.nodes, opset_imports={"": 17})
    model = to_proto(ir.Model(graph, ir_version=8))
    session = onnxruntime().InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rows = [session.run(None, {"step": np.array([t], np.int64)}) for t in steps]
    return np.array(rows, dtype=np.float32)


def test_bias_corrections_are_within_1e_6_of_float64_up_to_a_million_steps():
    got = _corrections(BETAS, STEPS)
    steps = np.array(STEPS, dtype=np.float64)[:, None]
    reference64 = -np.expm1(steps * np.log(np.array(BETAS, dtype=np.float64)))
    assert got.dtype == np.float32
    # a relative bound only (scale 0: no absolute floor); the float32 reference is float64's
    # correction rounded once
    assert_close(
        got,
        reference64.astype(np.float32),
        reference64,
        rtol=1e-6,
        scale=0.0,
        name="1 - beta**t",
    )


def test_the_naive_float32_form_is_not_within_the_bound():
    """What the series is for: ``1 - beta**t`` written in float32 is 1e-5 to 1e-4 relative off."""
    steps = np.array([1, 2, 10, 100], np.float32)
    for beta in (0.999, 0.9999):
        naive = np.float32(1) - np.float32(beta) ** steps
        reference64 = -np.expm1(steps.astype(np.float64) * np.log(beta))
        assert np.max(np.abs(naive - reference64) / reference64) > 1e-5


def test_a_beta_of_zero_corrects_to_one():
    got = _corrections([0.0, 0.9], [1, 5])
    assert got[:, 0].tolist() == [1.0, 1.0]


def _float64_values(model: onnx.ModelProto) -> list[str]:
    """Every node of ``model`` that writes or casts to float64, by op and name."""
    inferred = onnx.shape_inference.infer_shapes(model)
    double = onnx.TensorProto.DOUBLE
    typed = {
        v.name
        for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
        if v.type.tensor_type.elem_type == double
    }
    found = []
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        casts = node.op_type == "Cast" and attrs["to"].i == double
        constant = node.op_type == "Constant" and attrs["value"].t.data_type == double
        if casts or constant or any(o in typed for o in node.output):
            found.append(f"{node.op_type} {node.name}")
    return found


OPTIMIZERS = {
    "AdamW": lambda: optim.AdamW(),
    "AdamW-hf": lambda: optim.AdamW(mode="hf", clip_grad=1.0),
    "SGD": lambda: optim.SGD(),
    "Adam-float32": lambda: optim.Adam(exact=False),
    "AdamW-amsgrad-float32": lambda: optim.AdamW(amsgrad=True, exact=False),
    "SGD-momentum-float32": lambda: optim.SGD(momentum=0.9, nesterov=True, exact=False),
    "Lamb-float32": lambda: optim.Lamb(exact=False),
    "Adagrad-float32": lambda: optim.Adagrad(lr_decay=0.01, exact=False),
    "RMSprop-float32": lambda: optim.RMSprop(momentum=0.9, centered=True, exact=False),
    "groups-float32": lambda: optim.Adam(
        exact=False, param_groups=[{"params": ["fc.bias"], "lr": 1e-2, "weight_decay": 0.1}]
    ),
}


def _linear_model() -> onnx.ModelProto:
    from onnx import helper

    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((3, 2)).astype(np.float32), "fc.w")
    bias = onnx.numpy_helper.from_array(np.zeros(2, np.float32), "fc.bias")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "fc.w"], ["h"]),
            helper.make_node("Add", ["h", "fc.bias"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 2])],
        [weight, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_default_portable_step_and_optimizer_graphs_hold_no_float64(name, tmp_path):
    made = artifacts.generate_artifacts(
        _linear_model(),
        requires_grad=["fc.w", "fc.bias"],
        loss=artifacts.LossType.MSELoss,
        optimizer=OPTIMIZERS[name](),
        artifact_directory=tmp_path,
        portable=True,
    )
    for path in (made.step_model, made.optimizer_model, made.training_model):
        assert path is not None
        assert _float64_values(onnx.load(path)) == [], path.name


def test_the_scan_sees_the_float64_of_torch_exact_rounding(tmp_path):
    """``exact=True`` (the family's default) takes torch's fused multiply-adds in float64."""
    made = artifacts.generate_artifacts(
        _linear_model(),
        requires_grad=["fc.w", "fc.bias"],
        loss=artifacts.LossType.MSELoss,
        optimizer=optim.Adam(),
        artifact_directory=tmp_path,
        portable=True,
    )
    assert made.step_model is not None
    assert any(f.startswith("Cast") for f in _float64_values(onnx.load(made.step_model)))
