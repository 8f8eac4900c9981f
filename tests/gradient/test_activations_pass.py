"""ActivationsAsElementary: each activation without a gradient builder, as elementary ops with the same values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from pass_oracle import check_pass, make_model, vi

from onnxblocks.gradient.activations import REWRITES, ActivationsAsElementary
from onnxblocks.gradient.rewrites import SoftplusAsElementary
from onnxblocks.ir.serde import from_proto

CASES = [
    ("Elu", {"alpha": 0.7}),
    ("Celu", {"alpha": 0.5}),
    ("Selu", {}),
    ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}),
    ("HardSwish", {}),
    ("ThresholdedRelu", {"alpha": 0.3}),
    ("Shrink", {"lambd": 0.4, "bias": 0.1}),
    ("Softsign", {}),
    ("Sign", {}),
    ("Mish", {}),
]
X = np.concatenate([np.linspace(-4, 4, 31), [0.0, 1e-3, -1e-3, 25.0, -25.0, 0.3, -0.4]]).astype(
    np.float32
)


@pytest.mark.parametrize(("op", "attrs"), CASES, ids=[c[0] for c in CASES])
def test_activation_becomes_elementary_with_the_same_values(op, attrs):
    model = make_model(
        [helper.make_node(op, ["x"], ["y"], **attrs)],
        [vi("x", [X.size])],
        [vi("y", [X.size])],
        opset=18,
    )
    after = check_pass(ActivationsAsElementary(), model, {"x": X}, {op: 1}, gone=op)
    if op == "Mish":  # Mish leaves a Softplus for the next pass
        check_pass(SoftplusAsElementary(), after, {"x": X}, {"Softplus": 1}, gone="Softplus")


def test_prelu_reads_its_slope_and_double_precision_stays_double():
    x = np.linspace(-3, 3, 12).reshape(3, 4)
    slope = np.array([0.1, -0.2, 0.3, 2.0])
    model = make_model(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        [vi("x", [3, 4], 11)],
        [vi("y", [3, 4], 11)],
        [helper.make_tensor("slope", 11, [4], slope)],
    )
    after = check_pass(ActivationsAsElementary(), model, {"x": x}, {"PRelu": 1}, gone="PRelu")
    assert "slope" in {i for n in after.graph.node for i in n.input}


def test_every_rewrite_is_registered_and_nothing_else_changes():
    assert set(REWRITES) == {c[0] for c in CASES} | {"PRelu"}
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])])
    ir_model = from_proto(model)
    result = ActivationsAsElementary()(ir_model)
    assert not result.modified and dict(result.changes) == {}
    assert [n.op_type for n in ir_model.graph] == ["Relu"]
