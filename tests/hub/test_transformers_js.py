"""Transformers.js loads what ``export_hub`` writes and generates like torch on the same weights, in Node and in Chromium.

The road of issue 35: an Optimum export of a tiny LLaMA without past (``support.optimum_env``,
its own venv) is fine-tuned by onnxblocks (every weight, or LoRA merged), and ``export_hub(into=)``
writes the trained weights into the with-past export of the same model, the file Transformers.js
generates from. Transformers.js 4.3 in Node (``support.transformers_js``, installed once into the
test cache; the local folder only, ``env.allowRemoteModels = false``) then generates 20 tokens
greedily:

* ``dtype: "fp32"``: token for token like transformers (torch) on the folder's
  ``model.safetensors``;
* ``dtype: "q8"`` (``model_quantized.onnx``): token for token like onnxruntime in Python running
  the same with-past file the way Transformers.js does (an empty cache, then one token a step);
* ``dtype: "q4"`` (``model_q4.onnx``, MatMulNBits; the full fine-tune): the same, on that file;

and the same two in headless Chromium (Debian's, driven by playwright-core; the folder, the
library and onnxruntime-web's wasm served on 127.0.0.1, nothing fetched from elsewhere).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.hub_models import greedy_torch
from support.optimum_env import optimum_export
from support.transformers_js import run_generate

from onnxblocks import TrainingSession
from onnxblocks.hub import from_hub
from onnxblocks.peft import LoraConfig

PROMPT = [5, 7, 8, 9]
STEPS = 20


def greedy_onnx_past(path: Path, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens from a with-past ``model.onnx``: the prompt on an empty cache, then one token
    a step with the growing cache and attention mask (as Transformers.js feeds it)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    past = [n for n in inputs if n.startswith("past_key_values.")]
    outputs = [o.name for o in session.get_outputs()]
    cache = {}
    for name in past:
        shape = inputs[name].shape  # [batch, kv heads, past, head dim]
        cache[name] = np.zeros((1, shape[1], 0, shape[3]), dtype=np.float32)
    ids, tokens = list(prompt), []
    step_ids = list(prompt)
    for _ in range(steps):
        length = len(ids)
        feed = {
            "input_ids": np.array([step_ids], dtype=np.int64),
            "attention_mask": np.ones((1, length), dtype=np.int64),
            **cache,
        }
        if "position_ids" in inputs:
            feed["position_ids"] = np.arange(length - len(step_ids), length, dtype=np.int64)[None]
        results = dict(zip(outputs, session.run(outputs, feed), strict=True))
        token = int(results["logits"][0, -1].argmax())
        cache = {n: results[n.replace("past_key_values.", "present.")] for n in past}
        tokens.append(token)
        ids.append(token)
        step_ids = [token]
    return tokens


@pytest.fixture(scope="module")
def exports() -> tuple[Path, Path]:
    return optimum_export("llama", with_past=False), optimum_export("llama", with_past=True)


def _fine_tune(nopast: Path, directory: Path, lora: LoraConfig | None) -> TrainingSession:
    from_hub(nopast, directory, lora=lora)
    session = TrainingSession(directory)
    rng = np.random.default_rng(1)
    ids = rng.integers(7, 27, (2, 8)).astype(np.int64)
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.broadcast_to(np.arange(8), ids.shape).copy(),
        "labels": ids,
    }
    for _ in range(5):
        session.train_and_update(*(feeds[n] for n in session.input_names))
    return session


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_transformers_js_in_node_and_chromium_generates_like_torch(exports, tmp_path, kind):
    nopast, past = exports
    lora = (
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        if kind == "lora"
        else None
    )
    session = _fine_tune(nopast, tmp_path / "artifacts", lora)
    dtypes = ("fp32", "q8", "q4") if kind == "full" else ("fp32", "q8")
    out = session.export_hub(tmp_path / "models" / "tiny", quantize=dtypes[1:], into=past)
    torch_tokens = greedy_torch(out, PROMPT, STEPS)
    assert greedy_onnx_past(out / "onnx" / "model.onnx", PROMPT, STEPS) == torch_tokens
    files = {"q8": "model_quantized.onnx", "q4": "model_q4.onnx"}
    references = {"fp32": torch_tokens}
    for dtype in dtypes[1:]:
        references[dtype] = greedy_onnx_past(out / "onnx" / files[dtype], PROMPT, STEPS)
    for dtype, reference in references.items():
        node = run_generate(tmp_path / "models", "tiny", dtype, PROMPT, STEPS)
        assert node == reference, f"Node, {dtype}"
        tokens = run_generate(tmp_path / "models", "tiny", dtype, PROMPT, STEPS, browser=True)
        assert tokens == reference, f"headless Chromium, {dtype}"
