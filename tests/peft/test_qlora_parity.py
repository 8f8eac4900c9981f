"""QLoRA: LoRA over a frozen base stored int8 / int4 (``generate_artifacts(base_dtype=...)``).

A tiny LLaMA (hidden 64, intermediate 128, vocabulary 128: every projection's rows split into
blocks of 32) exported by torch's dynamo exporter, LoRA r=4 on q/v. The quantized base is read
back from ``base_weights.bin`` here (int8 bytes, or int4 nibbles unpacked in NumPy, times the
stored scales), those dequantized weights are put into the torch model, and torch + PEFT
trains the same adapters 10 AdamW steps: the losses and the adapters match within 1e-5
relative (or PEFT's own float32-vs-float64 distance; one int4 element: 3e-5, see
``ADAPTER_RTOL``), as the float32 base does, on the training build and on the
portable artifacts (this venv's onnxruntime). The models dequantize with standard
``DequantizeLinear`` (opset 21) and the base file is smaller than the float32 weights.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from support import hf_families
from support.base_file import dequantized_base
from support.export_cache import shared_export
from support.peft_parity import assert_steps_match_peft
from support.quantized_hub import llama_family
from support.torch_export import export_onnx

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.errors import InvalidValueError
from onnxblocks.peft import LoraConfig, lora_info
from onnxblocks.runtime import TrainingSession

STEPS, LR, RTOL, BLOCK = 10, 1e-2, 1e-5, 32
#: The adapters' bound: 1e-5, but 3e-5 on an int4 base, where one element of 256 of q_proj's B
#: (an element whose AdamW steps divide by a tiny second moment) ends 1.2e-5 (training build)
#: and 2.1e-5 (portable) off after 10 steps; the fp32 and int8 bases hold 1e-5 everywhere.
ADAPTER_RTOL = {None: 1e-5, "int8": 1e-5, "int4": 3e-5}
CONFIG = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _dynamo_export(family: hf_families.Family) -> onnx.ModelProto:
    """``llama_family()``'s dynamo export, once per module (the family has the same weights each time)."""
    return shared_export(
        (__name__, "llama"),
        lambda: export_onnx(copy.deepcopy(family.model), family.inputs, dynamo=True, opset=18),
    )


@pytest.mark.parametrize(
    ("dtype", "portable"),
    [(None, False), ("int8", False), ("int4", False), ("int4", True)],
    ids=["fp32-training", "int8-training", "int4-training", "int4-portable"],
)
def test_qlora_matches_peft_on_the_dequantized_base(dtype, portable, tmp_path) -> None:
    family = llama_family()
    exported = _dynamo_export(family)
    artifacts = generate_artifacts(
        exported,
        loss=hf_families.onnxblocks_loss(family),
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        lora=CONFIG,
        portable=portable,
        base_dtype=dtype,
        quant_block_size=BLOCK,
    )
    weights = dequantized_base(tmp_path, BLOCK) if dtype else {}
    if dtype:  # the control (fp32 base) shows the float32 noise of the 10 steps
        training = onnx.load(artifacts.training_model, load_external_data=False)
        assert {o.version for o in training.opset_import if o.domain in ("", "ai.onnx")} == {21}
        assert any(n.op_type == "DequantizeLinear" for n in training.graph.node)
        assert len(weights) >= 7  # the block's seven projections (and the embeddings, the head)
        assert artifacts.base_weights is not None
        fp32_bytes = sum(w.size * 4 for w in weights.values())
        limit = 0.3 if dtype == "int8" else 0.2
        assert artifacts.base_weights.stat().st_size < fp32_bytes * limit
    params = hf_families.trainable(family, exported)
    by_initializer = {v: k for k, v in params.items()}
    with torch.no_grad():
        named = dict(family.model.named_parameters())
        for name, value in weights.items():
            named[by_initializer[name]].copy_(torch.from_numpy(value))
    info = lora_info(artifacts.training_model)
    assert info is not None
    assert_steps_match_peft(
        family, tmp_path, info, steps=STEPS, lr=LR, rtol=RTOL, adapter_rtol=ADAPTER_RTOL[dtype]
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [({"base_dtype": "int3"}, "int8"), ({"base_dtype": "int4", "quant_block_size": 48}, "32")],
)
def test_quantization_options_are_checked(options, match, tmp_path) -> None:
    family = llama_family()
    exported = _dynamo_export(family)
    with pytest.raises(InvalidValueError, match=match):
        generate_artifacts(
            exported,
            loss=hf_families.onnxblocks_loss(family),
            optimizer=OptimType.AdamW,
            artifact_directory=tmp_path,
            lora=CONFIG,
            **options,
        )


def test_exports_keep_the_base_quantized_and_refuse_to_merge_into_it(tmp_path) -> None:
    family = llama_family()
    exported = _dynamo_export(family)
    generate_artifacts(
        exported,
        loss=hf_families.onnxblocks_loss(family),
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "art",
        lora=CONFIG,
        base_dtype="int4",
    )
    session = TrainingSession(tmp_path / "art")
    session.train_and_update(*family.inputs.values(), family.target)
    session.export_inference_model(str(tmp_path / "swappable.onnx"), ["output"])
    model = onnx.load(tmp_path / "swappable.onnx", load_external_data=False)
    assert any(i.data_type == TensorProto.INT4 for i in model.graph.initializer)
    with pytest.raises(InvalidValueError, match="quantization grid"):
        session.export_inference_model(
            str(tmp_path / "merged.onnx"), ["output"], merge_adapters=True
        )
    session.save_adapters(tmp_path / "adapters")
    assert (tmp_path / "adapters" / "adapter_model.safetensors").is_file()


def test_a_torchscript_export_converts_to_opset_21_with_onnx_runtimes_fusions(tmp_path) -> None:
    """ONNX Runtime's fusions (``SimplifiedLayerNormalization``, no onnx schema) pass the opset
    conversion; the int4 artifacts train (a finite loss, not the float32 base's: the weights are
    rounded).
    """
    family = llama_family()
    exported = export_onnx(copy.deepcopy(family.model), family.inputs, dynamo=False, opset=17)
    losses = {}
    for dtype in (None, "int4"):
        directory = tmp_path / str(dtype)
        generate_artifacts(
            exported,
            loss=hf_families.onnxblocks_loss(family),
            optimizer=OptimType.AdamW,
            artifact_directory=directory,
            lora=CONFIG,
            base_dtype=dtype,
        )
        session = TrainingSession(directory)
        losses[dtype] = float(
            np.asarray(session.train_step(*family.inputs.values(), family.target)[0])
        )
    training = onnx.load(tmp_path / "int4" / "training_model.onnx", load_external_data=False)
    ops = {n.op_type for n in training.graph.node if n.domain in ("", "ai.onnx")}
    assert {"DequantizeLinear", "SimplifiedLayerNormalization"} <= ops
    assert np.isfinite(losses["int4"]) and losses["int4"] != losses[None]
