"""``from_hub`` on Optimum exports of tiny random-init models, against transformers on the same weights.

The exports are made by the tests (``support.optimum_env``: optimum-onnx 0.1.0 in a venv of its own);
torch's reference loads the same folder's ``model.safetensors`` with the main venv's transformers.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.numerics import assert_close
from support.optimum_env import optimum_export

from onnxblocks.errors import FileMissingError, InvalidValueError
from onnxblocks.hub import from_hub, read_record
from onnxblocks.peft import LoraConfig
from onnxblocks.runtime import TrainingSession

BATCH, SEQ = 2, 7


def _batch(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(7, 27, size=(BATCH, SEQ), dtype=np.int64)
    labels = ids.copy()
    labels[0, :2] = -100  # a prompt, ignored
    return {
        "input_ids": ids,
        "attention_mask": np.ones((BATCH, SEQ), np.int64),
        "position_ids": np.tile(np.arange(SEQ, dtype=np.int64), (BATCH, 1)),
        "labels": labels,
    }


def _feeds(session: TrainingSession, batch: dict, config: dict, names=None) -> list[np.ndarray]:
    """The session's inputs in order; past key values as an empty cache (past length 0)."""
    heads = config["num_key_value_heads"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    empty = np.zeros((BATCH, heads, 0, head_dim), np.float32)
    return [batch[n] if n in batch else empty for n in names or session.input_names]


def _torch_loss(hub, batch: dict) -> tuple[float, float]:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    losses = []
    for dtype in (torch.float32, torch.float64):
        model = AutoModelForCausalLM.from_pretrained(hub, dtype=dtype).eval()
        with torch.no_grad():
            out = model(
                input_ids=torch.from_numpy(batch["input_ids"]),
                attention_mask=torch.from_numpy(batch["attention_mask"]),
                labels=torch.from_numpy(batch["labels"]),
            )
        losses.append(float(out.loss))
    return losses[0], losses[1]


@pytest.fixture(scope="module")
def llama_hubs():
    return {past: optimum_export("llama", with_past=past) for past in (False, True)}


@pytest.mark.parametrize("with_past", [False, True], ids=["no-past", "empty-past"])
def test_causal_lm_loss_equals_transformers_shifted_cross_entropy(llama_hubs, tmp_path, with_past):
    hub = llama_hubs[with_past]
    config = json.loads((hub / "config.json").read_text())
    from_hub(hub, tmp_path / "art")
    record = read_record(tmp_path / "art")
    assert (record.task, record.with_past, record.file) == (
        "causal-lm",
        with_past,
        "onnx/model.onnx",
    )
    assert bool(record.present_outputs) == with_past
    session = TrainingSession(tmp_path / "art")
    batch = _batch(config)
    expected, expected64 = _torch_loss(hub, batch)
    eval_loss = session.eval_step(*_feeds(session, batch, config, session.eval_input_names))[0]
    train_loss = session.train_step(*_feeds(session, batch, config))[0]
    for loss in (eval_loss, train_loss):
        assert_close(np.float32(loss), np.float32(expected), np.float64(expected64), rtol=1e-5)


def test_with_past_eval_returns_the_present_cache(llama_hubs, tmp_path):
    hub = llama_hubs[True]
    config = json.loads((hub / "config.json").read_text())
    from_hub(hub, tmp_path / "art")
    session = TrainingSession(tmp_path / "art")
    outputs = session.eval_step(*_feeds(session, _batch(config), config, session.eval_input_names))
    heads, head_dim = config["num_key_value_heads"], config["hidden_size"] // 4
    assert outputs[1].shape == (BATCH, SEQ, config["vocab_size"])  # logits
    assert [o.shape for o in outputs[2:]] == [(BATCH, heads, SEQ, head_dim)] * 4


def test_lora_on_a_with_past_export_trains_and_names_its_base(llama_hubs, tmp_path):
    hub = llama_hubs[True]
    config = json.loads((hub / "config.json").read_text())
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    from_hub(hub, tmp_path / "art", lora=lora)
    session = TrainingSession(tmp_path / "art")
    session.learning_rate = 0.05
    batch = _batch(config)
    losses = []
    for _ in range(4):
        losses.append(float(session.train_step(*_feeds(session, batch, config))[0]))
        session.optimizer_step()
    assert losses[-1] < losses[0], losses
    written = json.loads(
        (session.save_adapters(tmp_path / "adapters") / "adapter_config.json").read_text()
    )
    assert written["task_type"] == "CAUSAL_LM"
    assert written["base_model_name_or_path"] == hub.name


def test_layouts_flat_and_by_name(llama_hubs, tmp_path):
    flat = tmp_path / "flat"
    shutil.copytree(llama_hubs[False], flat)
    (flat / "onnx" / "model.onnx").rename(flat / "model.onnx")
    from_hub(flat, tmp_path / "a1")
    assert read_record(tmp_path / "a1").file == "model.onnx"
    (flat / "onnx" / "model_fp16.onnx").write_bytes((flat / "model.onnx").read_bytes())
    from_hub(flat, tmp_path / "a2", file="model_fp16.onnx")
    assert read_record(tmp_path / "a2").file == "onnx/model_fp16.onnx"
    with pytest.raises(
        FileMissingError, match="model_q4.onnx.*It has model.onnx, onnx/model_fp16.onnx"
    ):
        from_hub(flat, tmp_path / "a3", file="model_q4.onnx")
    with pytest.raises(InvalidValueError, match="inside the hub folder"):
        from_hub(flat, tmp_path / "a3", file="../x.onnx")


def test_a_task_that_cannot_be_told_asks_for_task(llama_hubs, tmp_path):
    hub = tmp_path / "hub"
    shutil.copytree(llama_hubs[False], hub)
    (hub / "config.json").write_text(json.dumps({"architectures": ["LlamaModel"]}))
    with pytest.raises(InvalidValueError, match="Pass task="):
        from_hub(hub, tmp_path / "art")
    from_hub(hub, tmp_path / "art", task="causal-lm")
    assert read_record(tmp_path / "art").task == "causal-lm"
    with pytest.raises(InvalidValueError, match="from_hub decides loss from the task"):
        from_hub(hub, tmp_path / "art2", loss=None)


@pytest.mark.parametrize("base_dtype", [None, "float16"])
def test_a_small_frozen_base_exports_as_one_file(llama_hubs, tmp_path, base_dtype):
    """Transformers.js in the browser cannot load ``model.onnx.data``: below 1 GiB, weights inline."""
    ort = pytest.importorskip("onnxruntime")
    hub = llama_hubs[False]
    config = json.loads((hub / "config.json").read_text())
    lora = LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    from_hub(hub, tmp_path / "art", lora=lora, base_dtype=base_dtype)
    assert (tmp_path / "art" / "base_weights.bin").is_file()
    session = TrainingSession(tmp_path / "art")
    batch = _batch(config)
    expected = session.eval_step(*_feeds(session, batch, config, session.eval_input_names))[1]
    exported = session.export_inference_model(tmp_path / "out" / "model.onnx", ["logits"])
    assert sorted(p.name for p in exported.parent.iterdir()) == ["model.onnx"]
    inference = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    names = [i.name for i in inference.get_inputs()]
    (got,) = inference.run(["logits"], {n: batch[n] for n in names})
    assert_close(got, expected, rtol=1e-5, name="exported logits")  # ours against ours


def test_portable_artifacts_train_with_an_empty_cache_on_the_portable_backend(llama_hubs, tmp_path):
    """Stock onnxruntime's road: LoRA (B = 0 at first, so the base's loss) on a with-past export."""
    hub = llama_hubs[True]
    config = json.loads((hub / "config.json").read_text())
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    from_hub(hub, tmp_path / "art", lora=lora, portable=True)
    session = TrainingSession(tmp_path / "art", backend="portable")
    session.learning_rate = 0.05
    batch = _batch(config)
    expected, expected64 = _torch_loss(hub, batch)
    losses = []
    for _ in range(3):
        losses.append(session.train_step(*_feeds(session, batch, config))[0])
        session.optimizer_step()
    assert_close(np.float32(losses[0]), np.float32(expected), np.float64(expected64), rtol=1e-5)
    assert losses[-1] < losses[0], losses


def test_training_with_an_empty_cache_follows_the_no_cache_export(llama_hubs, tmp_path):
    """Same weights, same batch: three SGD steps give the same losses with and without past inputs."""
    from onnxblocks.artifacts import OptimType

    config = json.loads((llama_hubs[False] / "config.json").read_text())
    batch = _batch(config)
    runs = []
    for past in (False, True):
        from_hub(llama_hubs[past], tmp_path / str(past), optimizer=OptimType.SGD)
        session = TrainingSession(tmp_path / str(past))
        session.learning_rate = 0.5
        losses = []
        for _ in range(3):
            losses.append(session.train_step(*_feeds(session, batch, config))[0])
            session.optimizer_step()
        runs.append(np.array(losses, np.float32))
    assert runs[0][-1] < runs[0][0]
    assert_close(runs[1], runs[0], rtol=1e-5, name="with-past losses")  # ours against ours
