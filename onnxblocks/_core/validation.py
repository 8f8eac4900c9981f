"""Whole-model validation that never reads weight bytes."""

from __future__ import annotations

import onnx
from onnx import helper

from onnxblocks._core import limits as _limits
from onnxblocks._core.proto import copy_fields


def check_skeleton(model: onnx.ModelProto) -> None:
    """Run onnx's model checker once on ``model`` without touching weight bytes.

    Stubs and external-data initializers are turned into graph inputs of the same
    type in a throw-away skeleton, so the check costs O(graph), not O(weights).

    Raises:
        onnx.checker.ValidationError: if the model is invalid.
    """
    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, skip={"graph"})
    copy_fields(model.graph, skeleton.graph, skip={"initializer"})
    g, sg = model.graph, skeleton.graph
    input_names = {i.name for i in g.input}
    for init in g.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            if init.name not in input_names:
                sg.input.append(
                    helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                )
        else:
            sg.initializer.append(init)
    _limits.stamp_versions(skeleton)
    onnx.checker.check_model(skeleton)
