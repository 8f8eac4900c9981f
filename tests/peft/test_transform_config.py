"""LoraConfig: PEFT's names and defaults, the adapter_config.json round trip, and the refusals."""

from __future__ import annotations

import json

import pytest

from onnxblocks.errors import FileMissingError, InvalidTypeError, InvalidValueError
from onnxblocks.peft import LoraConfig, LoraInfo, LoraTarget


def test_defaults_are_peft_defaults():
    config = LoraConfig()
    assert (config.r, config.lora_alpha, config.lora_dropout, config.bias) == (8, 8, 0.0, "none")
    assert (
        config.target_modules is None
        and config.fan_in_fan_out is False
        and config.init_lora_weights is True
    )
    assert LoraConfig(r=4, lora_alpha=16).scaling == 4.0


def test_peft_dict_round_trip_and_peft_keys():
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["v_proj", "q_proj"], lora_dropout=0.05)
    data = config.to_peft_dict()
    assert data["peft_type"] == "LORA" and data["r"] == 4 and data["lora_alpha"] == 16
    assert data["target_modules"] == ["v_proj", "q_proj"]
    assert (
        data["use_dora"] is False and data["rank_pattern"] == {} and data["modules_to_save"] is None
    )
    assert LoraConfig.from_peft_dict(json.loads(json.dumps(data))) == config
    regex = LoraConfig(target_modules=r".*\.(q|v)_proj")
    assert LoraConfig.from_peft_dict(regex.to_peft_dict()).target_modules == r".*\.(q|v)_proj"


def test_reads_what_peft_writes(tmp_path):
    """A file as PEFT 0.21 writes it (its keys at their defaults) is read, from the file or its folder."""
    written = LoraConfig(
        r=2, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True
    ).to_peft_dict()
    written.update(
        peft_version="0.21.2",
        megatron_core="megatron.core",
        qalora_group_size=16,
        task_type="CAUSAL_LM",
    )
    (tmp_path / "adapter_config.json").write_text(json.dumps(written))
    for path in (tmp_path, tmp_path / "adapter_config.json"):
        config = LoraConfig.from_json_file(path)
        assert (config.r, config.lora_alpha, config.target_modules, config.fan_in_fan_out) == (
            2,
            4,
            ("c_attn",),
            True,
        )
        assert config.task_type == "CAUSAL_LM"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("use_dora", True),
        ("use_rslora", True),
        ("rank_pattern", {"q_proj": 4}),
        ("alpha_pattern", {"q_proj": 4}),
        ("layers_to_transform", [0]),
        ("modules_to_save", ["classifier"]),
        ("lora_bias", True),
        ("target_parameters", ["experts.weight"]),
        ("bias", "all"),
        ("init_lora_weights", "pissa"),
        ("some_future_option", 3),
    ],
)
def test_unsupported_options_are_refused_naming_the_key(tmp_path, key, value):
    data = LoraConfig(target_modules=["q_proj"]).to_peft_dict()
    data[key] = value
    with pytest.raises(InvalidValueError, match=key):
        LoraConfig.from_peft_dict(data)
    (tmp_path / "adapter_config.json").write_text(json.dumps(data))
    with pytest.raises(InvalidValueError, match=f"adapter_config.json.*{key}"):
        LoraConfig.from_json_file(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"r": 0}, InvalidValueError, "r must be at least 1"),
        ({"r": 2.0}, InvalidTypeError, "r must be an int"),
        ({"lora_alpha": -1}, InvalidValueError, "lora_alpha"),
        ({"lora_dropout": 1.0}, InvalidValueError, "lora_dropout"),
        ({"target_modules": []}, InvalidValueError, "target_modules"),
        ({"target_modules": [3]}, InvalidTypeError, "target_modules"),
        ({"fan_in_fan_out": 1}, InvalidTypeError, "fan_in_fan_out"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        LoraConfig(**kwargs)


def test_file_errors(tmp_path):
    with pytest.raises(FileMissingError, match="adapter_config.json"):
        LoraConfig.from_json_file(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(InvalidValueError, match="not a JSON"):
        LoraConfig.from_json_file(tmp_path)
    with pytest.raises(InvalidValueError, match="peft_type"):
        LoraConfig.from_peft_dict({"peft_type": "IA3"})


def test_info_json_round_trip_and_checks():
    target = LoraTarget(
        "m.q_proj",
        "w",
        "out_in",
        "MatMul_0",
        8,
        4,
        "m.q_proj.lora_A.weight",
        "m.q_proj.lora_B.weight",
        2.0,
    )
    info = LoraInfo(LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]), {"m.q_proj": target})
    assert LoraInfo.from_json(info.to_json()) == info
    assert info.adapter_names == ("m.q_proj.lora_A.weight", "m.q_proj.lora_B.weight")
    bad = json.loads(info.to_json())
    bad["targets"]["m.q_proj"]["weight_layout"] = "sideways"
    with pytest.raises(InvalidValueError, match="m.q_proj.*weight_layout"):
        LoraInfo.from_json(json.dumps(bad))


def test_lora_info_of_files_and_malformed_records(tmp_path):
    import onnx
    from support.runtime_support import mlp_model

    from onnxblocks._core.contracts import LORA_METADATA
    from onnxblocks.peft import apply_lora, lora_info

    assert lora_info(mlp_model()) is None
    path = tmp_path / "lora.onnx"
    onnx.save(apply_lora(mlp_model(), LoraConfig(r=2, target_modules=["fc1"])), path)
    info = lora_info(path)
    assert info is not None and info.targets["fc1"].lora_A == "fc1.lora_A.weight"
    with pytest.raises(FileMissingError, match="missing.onnx"):
        lora_info(tmp_path / "missing.onnx")
    with pytest.raises(InvalidTypeError, match="ModelProto or a path"):
        lora_info(3)  # type: ignore[arg-type]
    for text, match in [
        ("{", "not JSON"),
        ("[]", "no 'config'"),
        ('{"config": {}}', "no 'targets'"),
    ]:
        model = mlp_model()
        model.metadata_props.add(key=LORA_METADATA, value=text)
        with pytest.raises(InvalidValueError, match=match):
            lora_info(model)
    bad = json.loads(info.to_json())
    bad["targets"]["fc1"]["in_features"] = -1
    with pytest.raises(InvalidValueError, match="'fc1'.*in_features"):
        LoraInfo.from_json(json.dumps(bad))
