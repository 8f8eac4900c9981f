"""The numeric oracle of the gradient pass tests: run a pass on the IR, compare ONNX Runtime before and after."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper
from support.numerics import assert_close

from onnxblocks.ir.passes import Pass
from onnxblocks.ir.serde import from_proto, to_proto


def make_model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()) -> onnx.ModelProto:
    """A model of ``nodes`` at ``opset`` (IR version 8 below opset 19, else 10)."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [
        helper.make_opsetid("", opset),
        *(helper.make_opsetid(d, v) for d, v in extra_opsets),
    ]
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
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )  # run the nodes as written
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
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
    scale: Any = None,
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
        rtol: The relative bound of ``support.numerics.assert_close``: the model before and after are two
            graphs of the same dtype, neither the truth, so the bound is ``rtol`` plus the floor.
        scale: The floor's magnitude of the operands (one for every output); by default each output's largest
            element.

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
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert_close(g, w, rtol=rtol, scale=scale, name=f"output {i} after {type(pass_).__name__}")
    return after
