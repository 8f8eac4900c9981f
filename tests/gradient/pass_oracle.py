"""The numeric oracle of the gradient pass tests: run a pass on the IR, compare ONNX Runtime before and after."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from onnxblocks.ir.passes import Pass
from onnxblocks.ir.serde import from_proto, to_proto


def make_model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()) -> onnx.ModelProto:
    """A model of ``nodes`` at ``opset`` (IR version 8 below opset 19, else 10)."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8 if opset < 19 else 10
    return model


def vi(name: str, shape, elem: int = onnx.TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A tensor value info."""
    return helper.make_tensor_value_info(name, elem, shape)


def run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """``model``'s outputs from ONNX Runtime (CPU)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # run the nodes as written
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def check_pass(
    pass_: Pass,
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    changes: Mapping[str, int],
    *,
    gone: str | None = None,
    before_with_reference: bool = False,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> onnx.ModelProto:
    """Run ``pass_`` on the IR of ``model``; check its reported changes and that ONNX Runtime's outputs are unchanged.

    Args:
        pass_: The pass.
        model: The model before (not changed).
        feeds: Inputs to run both models on.
        changes: The changes the pass must report.
        gone: An op type that must be absent after the pass.
        before_with_reference: Run the model before with onnx's reference evaluator (for ops ONNX
            Runtime has no kernel for, e.g. a double-precision GRU).
        rtol: Relative tolerance of the comparison.
        atol: Absolute tolerance of the comparison.

    Returns:
        The model after the pass.
    """
    ir_model = from_proto(model)
    result = pass_(ir_model)
    assert dict(result.changes) == dict(changes)
    after = to_proto(ir_model)
    if gone is not None:
        assert gone not in {n.op_type for n in after.graph.node}
    if before_with_reference:
        from onnx.reference import ReferenceEvaluator

        want = [np.asarray(v) for v in ReferenceEvaluator(model).run(None, dict(feeds))]
    else:
        want = run(model, feeds)
    got = run(after, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return after
