"""A large quantized table (tied embedding and LM head) is dequantized a chunk of rows at a time.

``onnxblocks.ir.dequantize_rows`` applies to tables whose float32 copy is at least ``MIN_BYTES``
(32 MiB); here the thresholds are lowered so that a tiny tied LLaMA's ``[128, 64]`` table (and
its ``[128, 64]`` MLP weights) is read in chunks of 40 rows (40, 40, 40, 8). Against the same artifacts with the table dequantized
whole: the losses over 3 AdamW steps agree within 1e-6 relative, the adapters within 3e-5 (the
embedding's rows are exact; the gradient's ``g @ W`` is summed over the vocabulary in four parts,
and AdamW's first steps divide a last-bit difference by a tiny second moment, as in
``test_qlora_parity.py``: 7e-7 absolute on an element of 0.065 measured), on the
training build and portable artifacts, with the plain loss (the head's ``MatMul``) and the lean
loss (the head inside the loss); and no ``DequantizeLinear`` of the training graph writes more
than a chunk of the table's rows.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from support import hf_families
from support.numerics import assert_close
from support.torch_export import export_onnx

from onnxblocks import losses
from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.ir import dequantize_rows
from onnxblocks.peft import LoraConfig
from onnxblocks.runtime import TrainingSession

VOCAB, HIDDEN, ROWS, STEPS = 128, 64, 40, 3
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
        lora=CONFIG, portable=portable, base_dtype="int4", quant_block_size=32,
    )  # fmt: skip
    session = TrainingSession(directory)
    session.learning_rate = 1e-2
    batch = [*family.inputs.values(), family.target]
    steps = [float(np.asarray(session.train_and_update(*batch)[0])) for _ in range(STEPS)]
    graph = artifacts.step_model if portable else artifacts.training_model
    return np.float32(steps), session.parameters(), onnx.load(graph, load_external_data=False)


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
    assert_close(rows[0], whole[0], rtol=1e-6, name="losses")
    for name, value in whole[1].items():
        assert_close(rows[1][name], value, rtol=3e-5, name=name)
