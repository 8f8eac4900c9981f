"""Portable LoRA artifacts of language models exported with a dynamic batch and sequence.

A model exported for deployment has symbolic ``batch`` and ``seq`` dims. The training build's
graph then holds ONNX Runtime's own ops (``SimplifiedLayerNormalization``, ``ConcatTraining``)
that onnx shape inference does not know, and every broadcast gradient reduction needs its axes.
The lowering must decide those axes from the symbolic dims where they decide them, not leave
them all to run-time shape arithmetic: on SmolLM2-135M's 30 layers that arithmetic doubled the
graph, and ONNX Runtime did not open it in 8 minutes (docs/lora.md). Here, on tiny LLaMA and
Qwen2 configs (TorchScript, dynamic axes): the lowered graph holds no whole run-time broadcast
computation and at most twice the training build's nodes (measured 1.67x; 2.8x before), and it
trains a batch of another shape than the export's like torch + PEFT, and like the training build.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
import pytest
from support import hf_families
from support.numerics import assert_close
from support.peft_parity import peft_steps
from support.reference64 import family64

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.peft import LoraConfig, lora_info
from onnxblocks.runtime import TrainingSession

STEPS, LR = 4, 1e-2
CONFIG = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _ops(path) -> collections.Counter:
    return collections.Counter(
        n.op_type for n in onnx.load(path, load_external_data=False).graph.node
    )


def _losses(directory, batch) -> list[float]:
    session = TrainingSession(directory)
    session.learning_rate = LR
    return [
        float(np.asarray(session.train_and_update(*batch)[0]).reshape(-1)[0]) for _ in range(STEPS)
    ]


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_dynamic_axes_lower_to_a_graph_of_the_training_builds_size_that_trains_like_peft(
    name, tmp_path
):
    family = hf_families.make(name)
    model = hf_families.export(family, "ts", dynamic=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    kwargs = {
        "loss": hf_families.onnxblocks_loss(family),
        "optimizer": OptimType.AdamW,
        "lora": CONFIG,
    }
    training = generate_artifacts(model, artifact_directory=tmp_path / "training", **kwargs)
    portable = generate_artifacts(
        model, artifact_directory=tmp_path / "portable", portable=True, **kwargs
    )

    built, lowered = _ops(training.training_model), _ops(portable.training_model)
    assert lowered["Max"] == 0, "a broadcast reduction was left wholly to run-time shape arithmetic"
    assert sum(lowered.values()) <= 2 * sum(built.values()), (
        sum(lowered.values()),
        sum(built.values()),
    )

    rng = np.random.default_rng(7)  # batch 3 x 7 tokens: the export saw 2 x 5
    tokens = rng.integers(0, hf_families.VOCAB, (3, 8)).astype(np.int64)
    other = dataclasses.replace(
        family, inputs={"input_ids": tokens[:, :-1].copy()}, target=tokens[:, 1:].copy()
    )
    batch = [*other.inputs.values(), other.target]
    initial = TrainingSession(portable.directory).parameters()
    assert all(
        np.array_equal(initial[k], v)
        for k, v in TrainingSession(training.directory).parameters().items()
    )

    info = lora_info(portable.training_model)
    expected, _ = peft_steps(other, info, initial, STEPS, LR)
    expected64, _ = peft_steps(family64(other), info, initial, STEPS, LR)
    got_training, got_portable = (
        _losses(training.directory, batch),
        _losses(portable.directory, batch),
    )
    assert expected[-1] < expected[0]
    got_portable = np.float32(got_portable)
    assert_close(
        got_portable, np.float32(expected), expected64, rtol=1e-4, name="portable against PEFT"
    )
    # the training build is a float32 program like the portable one: no float64 truth between them
    assert_close(
        got_portable,
        np.float32(got_training),
        rtol=1e-5,
        name="portable against the training build",
    )
