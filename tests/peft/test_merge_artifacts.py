"""export_inference_model(merge_adapters=True) on artifacts whose frozen base is stored in float16 / bfloat16.

The merged weight stays in the stored type (``W + scale * B @ A`` rounded once) behind the same
Cast; the merged model gives the swappable export's logits within the stored type's rounding, has
no adapter node or tensor left, and reads no ``base_weights.bin`` of the artifacts.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from support.numerics import assert_close, eps

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.losses import CrossEntropyLoss
from onnxblocks.peft import LoraConfig
from onnxblocks.runtime import TrainingSession
from onnxblocks.torch import (
    lora_demo,
)  # the test extra (torch==2.13.0): fails, never skips, without it

BATCH = 2


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    return lora_demo.export_lm(copy.deepcopy(lora_demo.build_llama(0)), root / "base.onnx", BATCH)


def _logits(path, ids):
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": ids})[0]


@pytest.mark.parametrize("base_dtype", [None, "float16", "bfloat16"])
def test_merged_export_keeps_the_stored_type(base, tmp_path, base_dtype):
    generate_artifacts(
        os.fspath(base),
        loss=CrossEntropyLoss(class_axis=-1),
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "artifacts",
        additional_output_names=["logits"],
        lora=LoraConfig(r=4, lora_alpha=8, target_modules=("q_proj", "v_proj")),
        base_dtype=base_dtype,
    )
    session = TrainingSession(tmp_path / "artifacts")
    session.learning_rate = 0.05
    rng = np.random.default_rng(0)
    for _ in range(3):
        data = lora_demo.counting(rng, BATCH, 2)
        session.train_and_update(data[:, :-1], data[:, 1:])
    merged = session.export_inference_model(
        tmp_path / "out" / "merged.onnx", ["logits"], merge_adapters=True
    )
    swappable = session.export_inference_model(tmp_path / "out" / "swappable.onnx", ["logits"])
    model = onnx.load(os.fspath(merged))
    assert not [i.name for i in model.graph.initializer if "lora" in i.name]
    assert not [n.name for n in model.graph.node if ".lora" in n.name]
    assert "onnxblocks.lora" not in {p.key for p in model.metadata_props}
    info = session.lora
    assert info is not None
    stored = {i.name: i.data_type for i in model.graph.initializer}
    want = {
        None: onnx.TensorProto.FLOAT,
        "float16": onnx.TensorProto.FLOAT16,
        "bfloat16": onnx.TensorProto.BFLOAT16,
    }
    assert {stored[t.weight] for t in info.targets.values()} == {want[base_dtype]}
    ids = lora_demo.counting(rng, BATCH, 2)[:, :-1]
    # two exports of ours (no float64 truth); W + scale * B @ A is rounded once in the stored type, so the
    # floor is that type's rounding of the logits' magnitude
    expected = _logits(swappable, ids)
    stored_type = base_dtype or "float32"
    scale = np.abs(expected).max() * eps(stored_type) / eps("float32")
    tolerance = {None: 1e-5, "float16": 2e-3, "bfloat16": 2e-2}[base_dtype]
    assert_close(
        _logits(merged, ids), expected, rtol=tolerance, scale=scale, name="merged against swappable"
    )
    (tmp_path / "artifacts").rename(
        tmp_path / "gone"
    )  # self-contained: nothing refers back to the artifacts
    after = _logits(swappable, ids)
    assert_close(
        _logits(merged, ids), after, rtol=tolerance, scale=scale, name="without the artifacts"
    )
