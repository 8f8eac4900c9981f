"""A large quantized table (tied embedding and LM head) is dequantized a chunk of rows at a time.

``onnxblocks.ir.dequantize_rows`` applies to tables whose float32 copy is at least ``MIN_BYTES``
(32 MiB); here the thresholds are lowered so that a tiny tied LLaMA's ``[128, 64]`` table (and
its ``[128, 64]`` MLP weights) is read in chunks of 40 rows (40, 40, 40, 8). Against the same
artifacts with the table dequantized whole, over 3 AdamW steps, on the training build and portable
artifacts, with the plain loss (the head's ``MatMul``) and the lean loss (the head inside the loss):
the losses and the adapters agree within 1e-6 relative, or the chunked run is as near the float64
truth as a small multiple of the whole-table run's own distance from it (``support.numerics``'s
rule 2). The float64 truth is torch + PEFT in float64 on the same dequantized base and initial
adapters: the chunks change the order of ``g @ W``'s sum over the vocabulary, a float32 rounding
that AdamW's first steps amplify where a second moment is tiny. And no ``DequantizeLinear`` of the
training graph writes more than a chunk of the table's rows.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from support import hf_families
from support.base_file import dequantized_base
from support.numerics import assert_close, assert_equal
from support.peft_parity import peft_steps
from support.reference64 import family64
from support.torch_export import export_onnx

from onnxblocks import losses
from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.ir import dequantize_rows
from onnxblocks.peft import LoraConfig, lora_info
from onnxblocks.runtime import TrainingSession

VOCAB, HIDDEN, ROWS, STEPS, LR, BLOCK = 128, 64, 40, 3, 1e-2, 32
TABLE = "model.lm_head.weight"  # the tied table, as the dynamo export names it
CONFIG = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _family() -> hf_families.Family:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
        use_cache=False, tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.set_attn_implementation("eager")
    rng = np.random.default_rng(0)
    inputs = {"input_ids": rng.integers(0, VOCAB, (2, 8)).astype(np.int64)}
    wrapped = hf_families.Logits(model, list(inputs), {"attention_mask": "input_ids"}).train()
    return hf_families.Family("llama", wrapped, inputs, rng.integers(0, VOCAB, (2, 8)), "ce_last")


def _train(exported, family, directory, *, lean: bool, portable: bool):
    loss = (
        losses.CrossEntropyLoss(class_axis=-1, chunk_size=5, head_weight=TABLE)
        if lean
        else losses.CrossEntropyLoss(class_axis=-1)
    )
    artifacts = generate_artifacts(
        exported, loss=loss, optimizer=OptimType.AdamW, artifact_directory=directory,
        lora=CONFIG, portable=portable, base_dtype="int4", quant_block_size=BLOCK,
    )  # fmt: skip
    session = TrainingSession(directory)
    session.learning_rate = LR
    initial = session.parameters()
    batch = [*family.inputs.values(), family.target]
    steps = [float(np.asarray(session.train_and_update(*batch)[0])) for _ in range(STEPS)]
    graph = artifacts.step_model if portable else artifacts.training_model
    model = onnx.load(graph, load_external_data=False)
    return np.float32(steps), session.parameters(), model, initial


def _truth64(family, exported, directory, initial) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """torch + PEFT in float64 on the artifacts' dequantized base: the losses and final adapters."""
    by_initializer = {v: k for k, v in hf_families.trainable(family, exported).items()}
    named = dict(family.model.named_parameters())
    with torch.no_grad():
        for name, value in dequantized_base(directory, BLOCK).items():
            named[by_initializer[name]].copy_(torch.from_numpy(value))
    info = lora_info(directory / "training_model.onnx")
    assert info is not None
    losses, adapters = peft_steps(family64(family), info, initial, STEPS, LR)
    return np.float64(losses), adapters


def _dequantized_rows(model: onnx.ModelProto) -> list[int]:
    """The row counts of every dequantization of the table (chunks carry its name)."""
    graphs, rows = [model.graph], []
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            graphs += [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
            if node.op_type == "DequantizeLinear" and node.input[0].startswith(TABLE):
                chunk = node.input[0][len(TABLE) :]
                rows.append(VOCAB if not chunk else -np.subtract(*map(int, chunk[5:].split("_"))))
    return rows


@pytest.mark.parametrize(("lean", "portable"), [(False, False), (True, False), (True, True)])
def test_a_table_read_by_rows_trains_as_the_whole_table(lean, portable, tmp_path, monkeypatch):
    family = _family()
    exported = export_onnx(copy.deepcopy(family.model), family.inputs, dynamo=True, opset=18)
    whole = _train(exported, family, tmp_path / "whole", lean=lean, portable=portable)
    monkeypatch.setattr(dequantize_rows, "MIN_BYTES", VOCAB * HIDDEN * 4)
    monkeypatch.setattr(dequantize_rows, "CHUNK_BYTES", ROWS * HIDDEN * 4)
    rows = _train(exported, family, tmp_path / "rows", lean=lean, portable=portable)
    assert sorted(set(_dequantized_rows(whole[2]))) == [VOCAB]
    chunks = _dequantized_rows(rows[2])
    assert chunks and set(chunks) == {ROWS, VOCAB - 3 * ROWS}
    for name, value in whole[3].items():
        assert_equal(rows[3][name], value, name=f"initial {name}")
    losses64, adapters64 = _truth64(family, exported, tmp_path / "whole", whole[3])
    assert_close(rows[0], whole[0], losses64, rtol=1e-6, name="losses")
    for name, value in whole[1].items():
        assert_close(rows[1][name], value, adapters64[name], rtol=1e-6, name=name)
