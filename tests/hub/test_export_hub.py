"""``TrainingSession.export_hub``: the trained model back as a hub folder transformers loads.

A tiny LLaMA hub folder in Optimum's layout (``support.hub_models``: TorchScript with constant
folding, so Linear weights sit transposed under ``onnx::MatMul_N``) is fine-tuned for a few AdamW
steps (all weights, or LoRA merged), exported with ``export_hub``, and read back:

* ``model.safetensors`` under Hugging Face's names: ``AutoModelForCausalLM.from_pretrained`` gives
  the exported ONNX model's logits within the bound a float64 torch run of the same weights sets,
  and generates the same 20 greedy tokens as onnxruntime on ``onnx/model.onnx``;
* the trained weights are the session's, bit for bit, transposed back where the graph stored them;
* ``into``: the weights land in another export of the same model whose folded names differ;
* ``q8`` / ``q4``: ``model_quantized.onnx`` holds ``MatMulInteger``, ``model_q4.onnx``
  ``MatMulNBits`` whose run equals the float model on the dequantized 4-bit weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from support.hub_models import greedy_onnx, greedy_torch, make_hub
from support.numerics import assert_close, assert_equal

from onnxblocks import TrainingSession, generate_artifacts, losses, optim
from onnxblocks.errors import FileConflictError, InvalidTypeError, InvalidValueError
from onnxblocks.hub.quantize import q4_weight
from onnxblocks.hub.state_dict_names import StateName, state_dict_names
from onnxblocks.ir.serde import from_proto
from onnxblocks.peft import LoraConfig
from onnxblocks.safetensors import read_safetensors

PROMPT = [2, 5, 6, 7]
RNG = np.random.default_rng(0)
IDS = RNG.integers(4, 64, (2, 6)).astype(np.int64)
LABELS = RNG.integers(4, 64, (2, 6)).astype(np.int64)


def _ort_logits(path: Path, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    names = {i.name for i in session.get_inputs()}
    if "position_ids" in names:
        feed["position_ids"] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    return session.run(["logits"], feed)[0]


def _torch_logits(directory: Path, ids: np.ndarray, dtype) -> np.ndarray:
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), use_cache=False).logits.double().numpy()


@pytest.fixture(scope="module")
def hubs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hubs")
    return make_hub(root / "llama"), make_hub(root / "llama-positions", variant="positions")


def _train(hub: Path, directory: Path, lora: LoraConfig | None) -> TrainingSession:
    model = onnx.load(hub / "onnx" / "model.onnx")
    names = state_dict_names(from_proto(model).graph)
    params = None if lora is not None else sorted(names)
    generate_artifacts(
        hub / "onnx" / "model.onnx", requires_grad=params,
        loss=losses.CrossEntropyLoss(class_axis=-1), optimizer=optim.AdamW(lr=1e-2),
        artifact_directory=directory, lora=lora,
    )  # fmt: skip
    session = TrainingSession(directory)
    for _ in range(3):
        session.train_and_update(IDS, np.ones_like(IDS), LABELS)
    return session


@pytest.fixture(scope="module")
def full(hubs, tmp_path_factory) -> tuple[TrainingSession, Path]:
    root = tmp_path_factory.mktemp("full")
    session = _train(hubs[0], root / "artifacts", None)
    out = session.export_hub(root / "out", quantize=("q8", "q4"), source=hubs[0])
    return session, out


def test_the_folder_holds_what_transformers_js_loads(full, hubs):
    _, out = full
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (out / name).read_bytes() == (hubs[0] / name).read_bytes(), name
    for name in ("model.onnx", "model_quantized.onnx", "model_q4.onnx"):
        assert (out / "onnx" / name).is_file(), name
    assert not list((out / "onnx").glob("*data*")), "a small model is written inline"
    source = onnx.load(hubs[0] / "onnx" / "model.onnx")
    written = onnx.load(out / "onnx" / "model.onnx")
    assert [i.name for i in written.graph.input] == [i.name for i in source.graph.input]
    assert [o.name for o in written.graph.output] == [o.name for o in source.graph.output]


def test_trained_weights_are_the_sessions_under_hugging_face_names(full, hubs):
    session, out = full
    state, _ = read_safetensors(out / "model.safetensors")
    before, _ = read_safetensors(hubs[0] / "model.safetensors")
    assert sorted(state) == sorted(before)
    graph = from_proto(onnx.load(hubs[0] / "onnx" / "model.onnx")).graph
    names = state_dict_names(graph)
    q_proj = next(n for n in graph if n.name == "/model/layers.0/self_attn/q_proj/MatMul")
    folded = q_proj.inputs[1].name
    assert folded.startswith("onnx::MatMul_"), folded
    assert names[folded] == StateName("model.layers.0.self_attn.q_proj.weight", True)
    for onnx_name, hf in names.items():
        trained = session.get_parameter(onnx_name)
        assert_equal(state[hf.name], trained.T if hf.transposed else trained, name=hf.name)
        assert not np.array_equal(state[hf.name], before[hf.name]), f"{hf.name} did not train"


def test_transformers_loads_the_safetensors_to_the_onnx_logits(full):
    _, out = full
    ids = RNG.integers(4, 64, (2, 7)).astype(np.int64)
    onnx32 = _ort_logits(out / "onnx" / "model.onnx", ids)
    torch32 = _torch_logits(out, ids, torch.float32)
    torch64 = _torch_logits(out, ids, torch.float64)
    assert_close(onnx32, torch32.astype(np.float32), torch64, rtol=1e-5, name="logits")


def test_twenty_greedy_tokens_match_torch(full):
    _, out = full
    tokens = greedy_onnx(out / "onnx" / "model.onnx", PROMPT, 20)
    assert tokens == greedy_torch(out, PROMPT, 20)


def test_into_writes_the_weights_into_another_export(full, hubs, tmp_path):
    session, out = full
    other = session.export_hub(
        tmp_path / "into", quantize=(), safetensors=False, into=hubs[1], source=hubs[0]
    )
    written = onnx.load(other / "onnx" / "model.onnx")
    assert "position_ids" in [i.name for i in written.graph.input]
    ids = RNG.integers(4, 64, (1, 6)).astype(np.int64)
    expected = _ort_logits(out / "onnx" / "model.onnx", ids)
    assert_close(_ort_logits(other / "onnx" / "model.onnx", ids), expected, rtol=1e-6)
    assert not (other / "model.safetensors").exists()


def test_q8_and_q4_files(full):
    _, out = full
    q8 = onnx.load(out / "onnx" / "model_quantized.onnx")
    assert any(n.op_type == "MatMulInteger" for n in q8.graph.node)
    q4 = onnx.load(out / "onnx" / "model_q4.onnx")
    nbits = [n for n in q4.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 15  # 7 Linear layers a layer, two layers, and the head
    # the 4-bit model against the float model on the dequantized weights
    fp = onnx.load(out / "onnx" / "model.onnx")
    for tensor in fp.graph.initializer:
        if tensor.name.startswith("onnx::MatMul"):
            w = numpy_helper.to_array(tensor)
            packed, scales = q4_weight(w)
            q = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
            deq = (q.astype(np.float32) - 8) * np.repeat(scales.reshape(w.shape[1], -1), 32, 1)
            tensor.CopyFrom(numpy_helper.from_array(deq[:, : w.shape[0]].T.copy(), tensor.name))
    ref = out.parent / "dequantized.onnx"
    onnx.save(fp, ref)
    ids = RNG.integers(4, 64, (2, 5)).astype(np.int64)
    assert_close(_ort_logits(out / "onnx" / "model_q4.onnx", ids), _ort_logits(ref, ids), rtol=1e-5)
    _ort_logits(out / "onnx" / "model_quantized.onnx", ids)  # loads and runs


def test_merged_lora(hubs, tmp_path):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    session = _train(hubs[0], tmp_path / "artifacts", lora)
    out = session.export_hub(tmp_path / "out", quantize=(), source=hubs[0])
    merged = session.export_inference_model(tmp_path / "m.onnx", ["logits"], merge_adapters=True)
    ids = RNG.integers(4, 64, (2, 7)).astype(np.int64)
    onnx32 = _ort_logits(out / "onnx" / "model.onnx", ids)
    assert_close(onnx32, _ort_logits(merged, ids), rtol=1e-6, name="hub vs merged export")
    torch64 = _torch_logits(out, ids, torch.float64)
    assert_close(onnx32, _torch_logits(out, ids, torch.float32).astype(np.float32), torch64,
                 rtol=1e-5, name="logits")  # fmt: skip
    assert greedy_onnx(out / "onnx" / "model.onnx", PROMPT, 20) == greedy_torch(out, PROMPT, 20)


def test_lora_kept_apart(hubs, tmp_path):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])
    session = _train(hubs[0], tmp_path / "artifacts", lora)
    out = session.export_hub(tmp_path / "out", quantize=(), merge_adapters=False, source=hubs[0])
    assert (out / "adapter_model.safetensors").is_file()
    base, _ = read_safetensors(hubs[0] / "model.safetensors")
    state, _ = read_safetensors(out / "model.safetensors")
    for key, value in base.items():
        assert_equal(state[key], value, name=key)


def test_refusals(full, hubs, tmp_path):
    session, out = full
    with pytest.raises(FileConflictError, match="not an empty folder"):
        session.export_hub(out, source=hubs[0])
    with pytest.raises(InvalidValueError, match="unknown quantize"):
        session.export_hub(tmp_path / "a", quantize=("q3",), source=hubs[0])
    with pytest.raises(InvalidTypeError, match="tuple of names"):
        session.export_hub(tmp_path / "b", quantize="q8", source=hubs[0])
    with pytest.raises(FileConflictError, match="hub folder itself"):
        session.export_hub(hubs[0], source=hubs[0])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_export_hub_reads_the_record(full, hubs, tmp_path):
    from onnxblocks.hub.record import HubRecord, write_record

    session, _ = full
    directory = Path(session.files.directory)
    write_record(
        HubRecord(source=hubs[0].absolute(), file="onnx/model.onnx", task="causal-lm"), directory
    )
    session.save_checkpoint(directory / "trained.ckpt")
    out = tmp_path / "cli-out"
    done = subprocess.run(
        [sys.executable, "-m", "onnxblocks", "export-hub", str(directory), str(out),
         "--checkpoint", str(directory / "trained.ckpt"), "--quantize", "q8,q4"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "onnx" / "model_q4.onnx").is_file()
    state, _ = read_safetensors(out / "model.safetensors")
    ref, _ = read_safetensors(full[1] / "model.safetensors")
    for key, value in ref.items():
        assert_equal(state[key], value, name=key)
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"


def test_weights_over_the_inline_limit_go_where_transformers_js_looks(
    full, hubs, tmp_path, monkeypatch
):
    import onnxblocks.hub.export as hub_export

    session, out = full
    monkeypatch.setattr(hub_export, "INLINE_LIMIT", 1024)  # stands in for protobuf's 2 GiB
    big = session.export_hub(tmp_path / "big", quantize=("q8",), safetensors=False, source=hubs[0])
    assert (big / "onnx" / "model.onnx_data").is_file()
    assert (big / "onnx" / "model.onnx").stat().st_size < 100_000
    config = json.loads((big / "config.json").read_text())
    assert config["transformers.js_config"]["use_external_data_format"] == {"model.onnx": True}
    ids = RNG.integers(4, 64, (2, 5)).astype(np.int64)
    expected = _ort_logits(out / "onnx" / "model.onnx", ids)
    assert_equal(_ort_logits(big / "onnx" / "model.onnx", ids), expected, name="logits")
    _ort_logits(big / "onnx" / "model_quantized.onnx", ids)  # loads and runs
