"""LoRA adapters trained by the JavaScript client in Node (onnxruntime-node), saved as a PEFT directory.

Portable LoRA artifacts of a small LLaMA: the state file holds only the adapters and their
moments; 12 fused steps in Node give the Python portable backend's losses within 1e-5 relative
and the loss falls; ``onnxblocks-train --save-adapters`` writes a PEFT directory that loads into
``TrainingSession.load_adapters`` (the Node-trained adapters, exactly) and into
``peft.PeftModel.from_pretrained``, whose logits are the merged model's within 1e-5.

Needs Node and the client's npm packages (installed into a cache on first use,
tests/support/web_support.py); fails, never skips, without them.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch  # the test extra: fails, never skips, without it
from support import web_support
from support.numerics import assert_close
from support.reference64 import to64

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.losses import CrossEntropyLoss
from onnxblocks.peft import LoraConfig
from onnxblocks.runtime import TrainingSession
from onnxblocks.torch import (
    lora_demo,
)  # the test extra (torch==2.13.0): fails, never skips, without it
from onnxblocks.web import read_state, write_safetensors, write_state

STEPS, LR, BATCH = 12, 0.05, 4


@pytest.fixture(scope="module")
def js(tmp_path_factory):
    try:
        return web_support.workspace(tmp_path_factory.mktemp("client"))
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """(torch LM, artifact directory, batches) for portable LoRA artifacts with a state file."""
    root = tmp_path_factory.mktemp("lora")
    lm = lora_demo.build_llama(0)
    lora_demo.export_lm(copy.deepcopy(lm), root / "base.onnx", BATCH)
    directory = root / "artifacts"
    generate_artifacts(
        os.fspath(root / "base.onnx"),
        loss=CrossEntropyLoss(class_axis=-1),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        additional_output_names=["logits"],
        lora=LoraConfig(r=4, lora_alpha=8, target_modules=("q_proj", "v_proj")),
        portable=True,
    )
    write_state(directory)
    rng = np.random.default_rng(0)
    batches = [(d[:, :-1], d[:, 1:]) for d in (lora_demo.counting(rng, BATCH, 2) for _ in range(4))]
    return lm, directory, batches


def test_the_state_holds_only_the_adapters(lora):
    _, directory, _ = lora
    state = read_state(directory / "params.safetensors")
    session = TrainingSession(directory)
    assert session.lora is not None
    assert sorted(state.trainable) == sorted(session.lora.adapter_names) and not state.frozen
    base = sum(p.numel() for p in lora[0].parameters())
    adapters = sum(session.get_parameter(n).size for n in session.lora.adapter_names)
    assert sum(v.size for v in state.trainable.values()) == adapters < base / 4
    assert all(
        len(m) == 2 and m[0].shape == state.trainable[n].shape for n, m in state.moments.items()
    )


def test_node_trains_adapters_and_saves_a_peft_directory(js, lora, tmp_path):
    import peft  # the test extra: fails, never skips, without it

    lm, directory, batches = lora
    session = TrainingSession(directory)
    names = session.input_names
    write_safetensors(
        tmp_path / "plan.safetensors",
        {
            f"train/{i}/{n}": v
            for i, batch in enumerate(batches)
            for n, v in zip(names, batch, strict=True)
        },
    )
    report = web_support.run_node(
        js, "bin/onnxblocks-train.mjs", str(directory), "--plan", str(tmp_path / "plan.safetensors"),
        "--steps", str(STEPS), "--lr", str(LR), "--save-adapters", str(tmp_path / "adapters"),
    )  # fmt: skip
    session.learning_rate = LR
    python = [float(session.train_and_update(*batches[i % len(batches)])[0]) for i in range(STEPS)]
    node = np.array(report["losses"])
    # two float32 clients of ours: no float64 truth, the floor from the losses' size
    assert_close(np.float32(node), np.float32(python), rtol=1e-5, name="Node against Python")
    assert node[-3:].mean() < node[:3].mean() - 0.05  # it learns (a random base: slowly)

    # the directory loads into a fresh session (the Node-trained adapters, as Python trained them) and into peft
    fresh = TrainingSession(directory)
    fresh.load_adapters(tmp_path / "adapters")
    for name in fresh.lora.adapter_names:
        assert_close(fresh.get_parameter(name), session.get_parameter(name), rtol=1e-5, name=name)
    merged = fresh.export_inference_model(tmp_path / "merged.onnx", ["logits"], merge_adapters=True)
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(lm), tmp_path / "adapters").eval()
    ids = batches[0][0]
    import onnxruntime as ort

    ours = ort.InferenceSession(os.fspath(merged), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"input_ids": ids}
    )[0]
    with torch.no_grad():
        theirs = loaded(input_ids=torch.from_numpy(ids)).logits.numpy()
        theirs64 = to64(loaded)(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert_close(ours, theirs, theirs64, rtol=1e-5, name="logits against PEFT")
