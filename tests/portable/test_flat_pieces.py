"""The flat buffers of the portable optimizer join at most ``MAX_PIECES`` tensors per node.

WebGPU binds each input and output of a kernel as a storage buffer (default limit 8 per shader
stage): onnxruntime-web's WebGPU ``Concat`` of 16 LoRA adapters failed validation and the step
wrote zeros. A model of many small parameters (a GPT block: 20 of them) gets a tree of
``Concat``s and ``Split``s; its numbers are those of the training build
(``test_portable_artifacts.py::test_portable_models_track_the_training_build_and_torch[gpt]``).
"""

from __future__ import annotations

import onnx
from support.models import case

from onnxblocks import artifacts
from onnxblocks.portable.updates import MAX_PIECES


def test_no_concat_or_split_of_the_step_binds_more_than_max_pieces(tmp_path):
    c = case("gpt", "onnxscript")
    assert len(c.params) > 2 * MAX_PIECES
    artifacts.generate_artifacts(
        c.onnx_model,
        requires_grad=c.params,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path,
        portable=True,
    )
    step = onnx.load(tmp_path / "step_model.onnx")
    arity = {
        n.name: len(n.input) if n.op_type == "Concat" else len(n.output)
        for n in step.graph.node
        if n.op_type in ("Concat", "Split")
    }
    assert arity and max(arity.values()) <= MAX_PIECES, {k: v for k, v in arity.items() if v > 7}
    assert sum(v > 1 for v in arity.values()) > 2  # the flat buffers are still joined
