"""TrainingSession.save_adapters / load_adapters against peft: both backends, both exporters, LLaMA and GPT-2.

GPT-2's ``c_attn`` is a ``Conv1D`` (``fan_in_fan_out``).

* adapters trained by onnxblocks and saved load into ``peft.PeftModel.from_pretrained(base, dir)``,
  whose logits are the onnxblocks merged model's within 1e-5;
* adapters trained by torch + peft (B != 0) and saved by peft load into the session, whose
  exported model (adapter branch kept) gives peft's logits within 1e-5.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import onnxruntime as ort
import pytest
import torch  # the test extra: fails, never skips, without it
from support.numerics import assert_close
from support.reference64 import to64

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.errors import InvalidValueError, StateError
from onnxblocks.losses import CrossEntropyLoss
from onnxblocks.peft import LoraConfig
from onnxblocks.runtime import TrainingSession

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, SEQ, BATCH = 32, 6, 2


def _model(family: str):
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=16, use_cache=False, tie_word_embeddings=False,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config), ["q_proj", "v_proj"], False
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=16, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config), ["c_attn"], True


@pytest.fixture(
    scope="module",
    params=[
        ("llama", "torchscript"),
        ("gpt2", "torchscript"),
        ("llama", "dynamo"),
        ("gpt2", "dynamo"),
    ],
)
def family(request, tmp_path_factory):
    from onnxblocks.torch.lora_demo import export_lm

    name, exporter = request.param
    lm, targets, fan = _model(name)
    root = tmp_path_factory.mktemp(f"{name}-{exporter}")
    export_lm(copy.deepcopy(lm), root / "base.onnx", BATCH, SEQ, exporter=exporter)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, fan_in_fan_out=fan)
    return name, lm, root, config


@pytest.fixture(scope="module", params=["training", "portable"])
def session(request, family):
    _, _, root, config = family
    directory = root / f"artifacts-{request.param}"
    generate_artifacts(
        os.fspath(root / "base.onnx"),
        loss=CrossEntropyLoss(class_axis=-1),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        additional_output_names=["logits"],
        lora=config,
        portable=request.param == "portable",
    )
    session = TrainingSession(directory)
    assert session.backend == request.param
    return session


def _batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int64)
    return ids[:, :-1], ids[:, 1:]


def _logits(path, ids: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"input_ids": ids}
    )[0]


def _peft_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.eval()(input_ids=torch.from_numpy(ids)).logits.numpy()


def _assert_peft_logits(got: np.ndarray, model, ids: np.ndarray, merge: bool = False) -> None:
    """``got`` against the PEFT model's logits in float32 and in float64 (rtol 1e-5)."""
    references = [copy.deepcopy(model), to64(model)]
    if merge:
        references = [m.merge_and_unload() for m in references]
    expected, expected64 = (_peft_logits(m, ids) for m in references)
    assert_close(got, expected, expected64, rtol=1e-5, name="logits")


def test_peft_loads_adapters_trained_and_saved_by_onnxblocks(family, session, tmp_path):
    import peft  # the test extra: fails, never skips, without it

    _, lm, _, _ = family
    for seed in range(3):
        session.train_and_update(*_batch(seed))
    assert (
        max(
            np.abs(v).max()
            for n, v in session.parameters(trainable_only=True).items()
            if "lora_B" in n
        )
        > 0
    )
    directory = session.save_adapters(tmp_path / "adapters")
    merged = session.export_inference_model(
        tmp_path / "merged.onnx", ["logits"], merge_adapters=True
    )
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(lm), directory)
    ids, _ = _batch(10)
    _assert_peft_logits(_logits(merged, ids), loaded, ids)
    config = json.loads((directory / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"


def test_onnxblocks_loads_adapters_trained_and_saved_by_peft(family, session, tmp_path):
    import peft  # the test extra: fails, never skips, without it

    _, lm, _, config = family
    data = config.to_peft_dict()
    model = peft.get_peft_model(
        copy.deepcopy(lm),
        peft.LoraConfig(
            **{k: data[k] for k in ("r", "lora_alpha", "target_modules", "fan_in_fan_out")}
        ),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for seed in range(3):
        ids, labels = (torch.from_numpy(a) for a in _batch(seed))
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(tmp_path / "peft")
    session.load_adapters(tmp_path / "peft")
    exported = session.export_inference_model(
        tmp_path / "swappable.onnx", ["logits"]
    )  # adapter branch kept
    ids, _ = _batch(11)
    _assert_peft_logits(_logits(exported, ids), model, ids)
    merged = session.export_inference_model(
        tmp_path / "merged.onnx", ["logits"], merge_adapters=True
    )
    _assert_peft_logits(_logits(merged, ids), model, ids)
    _assert_peft_logits(_logits(merged, ids), model, ids, merge=True)


def test_load_adapters_refuses_what_does_not_fit(session, tmp_path):
    session.save_adapters(tmp_path / "ok")
    path = tmp_path / "ok" / "adapter_config.json"
    data = json.loads(path.read_text())
    before = session.parameters(trainable_only=True)
    for change, match in (
        ({"r": 8}, "rank r=8"),
        ({"lora_alpha": 32}, "scale"),
        ({"use_rslora": True}, "use_rslora"),
    ):
        path.write_text(json.dumps({**data, **change}))
        with pytest.raises(InvalidValueError, match=match):
            session.load_adapters(tmp_path / "ok")
    after = session.parameters(trainable_only=True)
    assert all(np.array_equal(before[n], after[n]) for n in before)  # nothing written


def test_adapters_need_lora_artifacts(tmp_path):
    from onnxblocks.demo import build_classifier

    generate_artifacts(
        build_classifier(), requires_grad=["fc1.weight"], loss=CrossEntropyLoss(), optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "plain", additional_output_names=["logits"],
    )  # fmt: skip
    session = TrainingSession(tmp_path / "plain")
    assert session.lora is None
    for call in (
        lambda: session.save_adapters(tmp_path / "a"),
        lambda: session.load_adapters(tmp_path / "a"),
    ):
        with pytest.raises(StateError, match="no LoRA adapters"):
            call()
    with pytest.raises(InvalidValueError, match="no LoRA adapters"):
        session.export_inference_model(tmp_path / "m.onnx", ["logits"], merge_adapters=True)
