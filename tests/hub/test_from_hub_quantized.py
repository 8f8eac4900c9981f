"""``from_hub`` on the quantized files of an Optimum with-past export (docs/lora.md, "Quantized hub
files").

The optimum LLaMA export (``support.optimum_env``) is copied and quantized by ONNX Runtime's own
quantizers (``support.quantized_hub``: ``onnx/model_quantized.onnx``, int8 ``MatMulInteger``;
``onnx/model_q4.onnx``, ``MatMulNBits``). LoRA trains on each with an empty cache; before training
(``lora_B`` zero) the loss is the one of the file's own forward: to float32 rounding for the
weight-only q4 file, within the activation quantization's gap for q8. Full fine-tuning is refused.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from support.numerics import assert_close
from support.optimum_env import optimum_export
from support.quantized_hub import quantize_4bit, quantize_int8

from onnxblocks.errors import InvalidValueError
from onnxblocks.hub import from_hub
from onnxblocks.peft import LoraConfig
from onnxblocks.runtime import TrainingSession

BATCH, SEQ = 2, 7
FILES = {"q8": "model_quantized.onnx", "q4": "model_q4.onnx"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantized") / "hub"
    shutil.copytree(optimum_export("llama", with_past=True), folder)
    onnx_dir = folder / "onnx"
    quantize_int8(onnx_dir / "model.onnx", onnx_dir / FILES["q8"])
    quantize_4bit(onnx_dir / "model.onnx", onnx_dir / FILES["q4"], folder.parent / "qdq.onnx")
    return folder


def _feeds(names, config: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(7, 27, size=(BATCH, SEQ), dtype=np.int64)
    heads = config["num_key_value_heads"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    known = {
        "input_ids": ids,
        "attention_mask": np.ones((BATCH, SEQ), np.int64),
        "position_ids": np.tile(np.arange(SEQ, dtype=np.int64), (BATCH, 1)),
        "labels": ids.copy(),
    }
    empty = np.zeros((BATCH, heads, 0, head_dim), np.float32)
    return {n: known.get(n, empty) for n in names}


def _own_loss(path, config: dict) -> float:
    """The shifted cross entropy of the quantized file's own logits (float64 from float32)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds([i.name for i in session.get_inputs()], config)
    logits = session.run(["logits"], feeds)[0].astype(np.float64)
    labels = _feeds(["labels"], config)["labels"]
    shifted, targets = logits[:, :-1], labels[:, 1:]
    top = shifted.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(shifted - top).sum(axis=-1)) + top[..., 0]
    picked = np.take_along_axis(shifted, targets[..., None], axis=-1)[..., 0]
    return float((log_z - picked).mean())


@pytest.mark.parametrize("form", list(FILES))
def test_lora_trains_on_a_quantized_with_past_export(hub, form, tmp_path) -> None:
    config = json.loads((hub / "config.json").read_text())
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    from_hub(hub, tmp_path / "art", file=FILES[form], lora=lora)
    session = TrainingSession(tmp_path / "art")
    session.learning_rate = 0.05
    feeds = _feeds(session.input_names, config)
    losses = []
    for _ in range(4):
        losses.append(float(np.asarray(session.train_step(*feeds.values())[0])))
        session.optimizer_step()
    assert losses[-1] < losses[0], losses
    own = _own_loss(hub / "onnx" / FILES[form], config)
    if form == "q4":  # weight-only: the file's own forward, to float32 rounding
        assert_close(np.float32(losses[0]), np.float32(own), rtol=1e-5)
    else:  # training's float activations against the file's uint8 ones
        assert abs(losses[0] - own) < 0.02 * abs(own), (losses[0], own)


@pytest.mark.parametrize("form", list(FILES))
def test_full_fine_tuning_of_a_quantized_file_points_to_the_float_file(hub, form, tmp_path) -> None:
    with pytest.raises(InvalidValueError, match=r"quantized.*q_proj.*onnx/model\.onnx"):
        from_hub(hub, tmp_path / "art", file=FILES[form])
