"""PEFT adapter directories written and read without torch or peft, checked against peft itself.

The model side is a LoraInfo built from the torch model's own modules (the record apply_lora
writes), so these tests check the file layer alone: keys, layouts, config, refusals.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
import torch  # the test extra: fails, never skips, without it
from support.numerics import assert_close
from support.reference64 import to64

from onnxblocks.errors import FileMissingError, InvalidTypeError, InvalidValueError, NotAFolderError
from onnxblocks.peft import LoraConfig, LoraInfo, LoraTarget
from onnxblocks.peft.files import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    peft_key,
    read_adapters,
    write_adapters,
)
from onnxblocks.safetensors import write_safetensors

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _llama():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
        use_cache=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config), ["q_proj", "v_proj"], False


def _gpt2():
    import transformers

    config = transformers.GPT2Config(
        vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=16, use_cache=False
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config), ["c_attn"], True


MODELS = {"llama": _llama, "gpt2": _gpt2}


def _info(model, targets, fan_in_fan_out, r=4, alpha=8) -> LoraInfo:
    """The record apply_lora would write for ``model`` (weight names as the torch parameters)."""
    config = LoraConfig(
        r=r, lora_alpha=alpha, target_modules=targets, fan_in_fan_out=fan_in_fan_out
    )
    out = {}
    for name, module in model.named_modules():
        if name.split(".")[-1] not in targets:
            continue
        weight = module.weight
        in_f, out_f = (
            (weight.shape[0], weight.shape[1])
            if fan_in_fan_out
            else (weight.shape[1], weight.shape[0])
        )
        out[name] = LoraTarget(
            module=name,
            weight=f"{name}.weight",
            weight_layout="in_out" if fan_in_fan_out else "out_in",
            node=f"/{name}/MatMul",
            in_features=in_f,
            out_features=out_f,
            lora_A=f"{name}.lora_A.weight",
            lora_B=f"{name}.lora_B.weight",
            scale_value=alpha / r,
        )
    return LoraInfo(config=config, targets=out)


def _peft_model(family: str, info: LoraInfo):
    import peft  # the test extra: fails, never skips, without it

    model, targets, fan = MODELS[family]()
    config = peft.LoraConfig(
        r=info.config.r,
        lora_alpha=info.config.lora_alpha,
        target_modules=targets,
        fan_in_fan_out=fan,
    )
    return model, peft.get_peft_model(model, config)


def _random_adapters(info: LoraInfo, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in info.targets.values():
        out[t.lora_A] = rng.standard_normal((info.config.r, t.in_features)).astype(np.float32)
        out[t.lora_B] = rng.standard_normal((t.out_features, info.config.r)).astype(np.float32)
    return out


@pytest.mark.parametrize("family", sorted(MODELS))
def test_peft_loads_what_onnxblocks_writes(tmp_path, family):
    """PeftModel.from_pretrained reads the directory; its adapters are the values written, its logits the merge's."""
    import peft  # the test extra: fails, never skips, without it

    base, targets, fan = MODELS[family]()
    info = _info(base, targets, fan)
    adapters = _random_adapters(info)
    write_adapters(tmp_path / "adapters", info, adapters)
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == [
        ADAPTER_CONFIG_FILE,
        ADAPTER_WEIGHTS_FILE,
    ]
    reference = {n: p.detach().clone() for n, p in base.state_dict().items()}
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapters")
    state = loaded.state_dict()
    for module, t in info.targets.items():
        for which, name in (("A", t.lora_A), ("B", t.lora_B)):
            key = f"base_model.model.{module}.lora_{which}.default.weight"
            np.testing.assert_array_equal(state[key].numpy(), adapters[name])
    # the same adapters folded by hand into a fresh copy of the base give peft's logits
    merged, _, _ = MODELS[family]()
    merged.load_state_dict(reference)
    merged64 = to64(merged).eval()  # merged in float64 too: the reference of support.numerics
    merged.eval()
    loaded.eval()
    with torch.no_grad():
        for module, t in info.targets.items():
            for model, dtype in ((merged, np.float32), (merged64, np.float64)):
                a, b = adapters[t.lora_A].astype(dtype), adapters[t.lora_B].astype(dtype)
                delta = dtype(t.scale_value) * b @ a
                model.get_submodule(module).weight += torch.from_numpy(delta.T if fan else delta)
        ids = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(3))
        expected, expected64 = merged(ids).logits.numpy(), merged64(ids).logits.numpy()
        assert_close(loaded(ids).logits.numpy(), expected, expected64, rtol=1e-5, name="logits")


@pytest.mark.parametrize("family", sorted(MODELS))
def test_onnxblocks_reads_what_peft_writes(tmp_path, family):
    """Adapters trained by torch + peft (so B != 0) read back exactly, by initializer name."""
    base, targets, fan = MODELS[family]()
    info = _info(base, targets, fan)
    _, model = _peft_model(family, info)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(tmp_path / "peft")
    adapters = read_adapters(tmp_path / "peft", info)
    state = model.state_dict()
    assert set(adapters) == set(info.adapter_names)
    for module, t in info.targets.items():
        b = adapters[t.lora_B]
        assert np.abs(b).max() > 0
        np.testing.assert_array_equal(
            b, state[f"base_model.model.{module}.lora_B.default.weight"].numpy()
        )
        np.testing.assert_array_equal(
            adapters[t.lora_A], state[f"base_model.model.{module}.lora_A.default.weight"].numpy()
        )


def _written(tmp_path, info, tensors=None, config=None):
    folder = tmp_path / "bad"
    folder.mkdir(exist_ok=True)
    if tensors is None:
        tensors = {peft_key(m, "A"): None for m in info.targets}
    write_safetensors(folder / ADAPTER_WEIGHTS_FILE, tensors)
    (folder / ADAPTER_CONFIG_FILE).write_text(json.dumps(config or info.config.to_peft_dict()))
    return folder


@pytest.fixture
def llama_info():
    base, targets, fan = _llama()
    return _info(base, targets, fan)


def _good(info):
    out = {}
    for module, t in info.targets.items():
        out[peft_key(module, "A")] = np.zeros((info.config.r, t.in_features), np.float32)
        out[peft_key(module, "B")] = np.zeros((t.out_features, info.config.r), np.float32)
    return out


def test_refuses_what_does_not_fit(tmp_path, llama_info):
    info = llama_info
    module = next(iter(info.targets))
    with pytest.raises(FileMissingError, match="No PEFT adapter directory"):
        read_adapters(tmp_path / "nowhere", info)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileMissingError, match="adapter_config.json"):
        read_adapters(tmp_path / "empty", info)
    # another rank, another scale, an unsupported option
    for change, match in (
        ({"r": 8}, "rank r=8"),
        ({"lora_alpha": 4}, "scale"),
        ({"use_dora": True}, "use_dora"),
    ):
        folder = _written(tmp_path, info, _good(info), {**info.config.to_peft_dict(), **change})
        with pytest.raises(InvalidValueError, match=match):
            read_adapters(folder, info)
    # a missing module, an unknown tensor, a wrong shape, an integer tensor, NaN
    good = _good(info)
    missing = {k: v for k, v in good.items() if module not in k}
    with pytest.raises(InvalidValueError, match="lacks the adapters"):
        read_adapters(_written(tmp_path, info, missing), info)
    with pytest.raises(InvalidValueError, match="no adapter for.*mlp"):
        read_adapters(
            _written(
                tmp_path,
                info,
                {**good, "base_model.model.mlp.lora_A.weight": good[peft_key(module, "A")]},
            ),
            info,
        )
    with pytest.raises(InvalidValueError, match=r"has shape \[4, 8\]"):
        read_adapters(
            _written(tmp_path, info, {**good, peft_key(module, "A"): np.zeros((4, 8), np.float32)}),
            info,
        )
    with pytest.raises(InvalidTypeError, match="adapters are floating point"):
        read_adapters(
            _written(
                tmp_path,
                info,
                {**good, peft_key(module, "A"): good[peft_key(module, "A")].astype(np.int32)},
            ),
            info,
        )
    nan = good[peft_key(module, "B")].copy()
    nan[0, 0] = np.nan
    with pytest.raises(InvalidValueError, match="NaN"):
        read_adapters(_written(tmp_path, info, {**good, peft_key(module, "B"): nan}), info)


def test_refuses_a_corrupt_weights_file_naming_it(tmp_path, llama_info):
    folder = _written(tmp_path, llama_info, _good(llama_info))
    path = folder / ADAPTER_WEIGHTS_FILE
    raw = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 10**9) + raw[8:])  # a header length past the end
    with pytest.raises(InvalidValueError, match=ADAPTER_WEIGHTS_FILE):
        read_adapters(folder, llama_info)
    path.write_bytes(raw[:-4])  # truncated
    with pytest.raises(InvalidValueError, match="truncated"):
        read_adapters(folder, llama_info)


def test_reads_bf16_and_fp16_adapters_and_adapter_named_keys(tmp_path, llama_info):
    """BF16 (read exactly as float32), F16, and keys that keep the adapter's name (``.default.``)."""
    info = llama_info
    good = _good(info)
    rng = np.random.default_rng(0)
    values = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in good.items()}
    bf16 = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in values.items()}
    folder = _written(tmp_path, info, good)
    header = {}
    offset = 0
    chunks = []
    for key, v in bf16.items():
        header[key.replace(".weight", ".default.weight")] = {
            "dtype": "BF16",
            "shape": list(v.shape),
            "data_offsets": [offset, offset + v.nbytes],
        }
        offset += v.nbytes
        chunks.append(v.tobytes())
    encoded = json.dumps(header).encode()
    (folder / ADAPTER_WEIGHTS_FILE).write_bytes(
        struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks)
    )
    adapters = read_adapters(folder, info)
    for module, t in info.targets.items():
        want = (bf16[peft_key(module, "A")].astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(adapters[t.lora_A], want)
    half = {k: v.astype(np.float16) for k, v in values.items()}
    adapters = read_adapters(_written(tmp_path, info, half), info)
    module, t = next(iter(info.targets.items()))
    np.testing.assert_array_equal(
        adapters[t.lora_B], half[peft_key(module, "B")].astype(np.float32)
    )


def test_write_is_atomic_and_checks_shapes(tmp_path, llama_info):
    info = llama_info
    adapters = _random_adapters(info)
    write_adapters(tmp_path / "a", info, adapters)
    before = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    bad = dict(adapters)
    name = next(iter(bad))
    bad[name] = bad[name][:, :3]
    with pytest.raises(InvalidValueError, match=name):
        write_adapters(tmp_path / "a", info, bad)
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == before
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotAFolderError, match="is a file"):
        write_adapters(tmp_path / "file", info, adapters)
