"""Recomputation (``generate_artifacts(recompute=...)``): the same numbers as without it.

Two-layer models of three families (a LLaMA with LoRA on q/v, GPT-2 and BERT fully trained), from
torch's TorchScript and dynamo exporters, on the training build and on portable artifacts (this
venv's onnxruntime, fused step): three AdamW steps with ``recompute="layers"`` give bit-identical
losses and parameters to ``recompute="none"`` (the clones run the same kernels on the same
inputs). The graphs hold a clone of each layer's forward; a ``Dropout`` inside a layer is not
cloned (its output and mask are kept from the forward, so the clones see the forward's mask: a
structural check, the masks of two sessions are not comparable); the dependency that delays the
clones survives ONNX Runtime's optimizations.
Bad policies are refused, naming what to pass.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from support import hf_families
from support.export_cache import shared_export
from support.numerics import assert_equal
from support.torch_export import export_onnx

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.errors import InvalidTypeError, InvalidValueError, UnknownNameError
from onnxblocks.peft import LoraConfig
from onnxblocks.runtime import TrainingSession

STEPS, LR = 3, 1e-2
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
VOCAB = 64


def _family(kind: str) -> hf_families.Family:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (2, 8)).astype(np.int64)
    target = rng.integers(0, VOCAB, (2, 8))
    masks = {"attention_mask": "input_ids"}
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
            use_cache=False, tie_word_embeddings=False,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    elif kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=16, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        model = transformers.BertForMaskedLM(config)
    model.set_attn_implementation("eager")
    wrapped = hf_families.Logits(model, ["input_ids"], masks).train()
    return hf_families.Family(kind, wrapped, {"input_ids": tokens}, target, "ce_last")


def _export(family: hf_families.Family, exporter: str) -> onnx.ModelProto:
    """The family's export (``"ts"`` or ``"dynamo"``), once per module: ``_family`` builds the same
    weights every time."""

    def build() -> onnx.ModelProto:
        dynamo = exporter == "dynamo"
        model = copy.deepcopy(family.model)
        return export_onnx(model, family.inputs, dynamo=dynamo, opset=18 if dynamo else 17)

    return shared_export((__name__, family.name, exporter), build)


def _train(family, exported, directory, *, portable, lora, recompute):
    requires = [] if lora else list(hf_families.trainable(family, exported).values())
    artifacts = generate_artifacts(
        exported,
        requires_grad=requires,
        loss=hf_families.onnxblocks_loss(family),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        lora=LORA if lora else None,
        portable=portable,
        recompute=recompute,
    )
    session = TrainingSession(directory)
    session.learning_rate = LR
    batch = [*family.inputs.values(), family.target]
    losses = [float(np.asarray(session.train_and_update(*batch)[0])) for _ in range(STEPS)]
    graph = artifacts.step_model if portable else artifacts.training_model
    return np.float32(losses), session.parameters(), onnx.load(graph, load_external_data=False)


CASES = [
    ("llama", "ts", False, True),
    ("llama", "ts", True, True),
    ("llama", "dynamo", False, True),
    ("llama", "dynamo", True, True),
    ("gpt2", "ts", False, False),
    ("gpt2", "dynamo", True, False),
    ("bert", "ts", False, False),
    ("bert", "ts", True, False),
]


@pytest.mark.parametrize(
    ("kind", "exporter", "portable", "lora"),
    CASES,
    ids=[
        f"{k}-{e}-{'portable' if p else 'training'}{'-lora' if lo else ''}" for k, e, p, lo in CASES
    ],
)
def test_recompute_layers_matches_no_recompute(kind, exporter, portable, lora, tmp_path) -> None:
    family = _family(kind)
    exported = _export(family, exporter)
    options = {"portable": portable, "lora": lora}
    losses, params, _ = _train(family, exported, tmp_path / "none", recompute="none", **options)
    got_losses, got_params, graph = _train(
        family, exported, tmp_path / "layers", recompute="layers", **options
    )
    clones = [n for n in graph.graph.node if "_recompute" in n.name]
    triggers = {n.name.split("/Size")[0] for n in clones if n.op_type == "Size"}
    assert len(triggers) == 2, f"one trigger per layer, not {sorted(triggers)}"
    assert len(clones) > 20
    assert not [n.name for n in clones if n.op_type in ("Dropout", "RandomUniformLike")]
    assert losses[-1] < losses[0]
    assert_equal(got_losses, losses, name="losses")
    assert sorted(got_params) == sorted(params)
    for name, value in params.items():
        assert_equal(got_params[name], value, name=name)


def test_the_clones_wait_for_the_gradient_after_onnx_runtimes_optimizations(tmp_path) -> None:
    """In the optimized step model (stock onnxruntime, all optimizations), each layer's clones
    still read through a ``Reshape`` whose shape depends on ``Size`` of a gradient."""
    import onnxruntime as ort

    family = _family("llama")
    exported = _export(family, "ts")
    artifacts = generate_artifacts(
        exported,
        loss=hf_families.onnxblocks_loss(family),
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "a",
        lora=LORA,
        portable=True,
        recompute="layers",
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(artifacts.step_model), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(tmp_path / "optimized.onnx", load_external_data=False)
    producers = {o: n for n in optimized.graph.node for o in n.output}
    sizes = [n for n in optimized.graph.node if n.op_type == "Size" and "_recompute" in n.name]
    assert len(sizes) >= 2, "the dependency of the clones on the gradient was folded away"
    for size in sizes:
        assert size.input[0].endswith("_grad") or "_grad" in size.input[0], size.input[0]
        assert producers.get(size.input[0]) is not None, f"{size.input[0]} became a constant"


@pytest.mark.parametrize(
    ("recompute", "error", "match"),
    [
        ("everything", InvalidValueError, "'layers'"),
        (3.0, InvalidTypeError, "list of module paths"),
        ([], InvalidValueError, "names no module path"),
        (["model.nowhere"], UnknownNameError, "model.nowhere"),
    ],
)
def test_bad_policies_are_refused(recompute, error, match, tmp_path) -> None:
    family = _family("llama")
    exported = _export(family, "ts")
    with pytest.raises(error, match=match):
        generate_artifacts(
            exported,
            loss=hf_families.onnxblocks_loss(family),
            artifact_directory=tmp_path,
            lora=LORA,
            recompute=recompute,
        )
    assert not list(tmp_path.iterdir())


def test_a_model_without_repeated_blocks_needs_module_paths(tmp_path) -> None:
    inner = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.SiLU())
    model = torch.nn.Sequential(inner, torch.nn.Linear(8, 3))
    exported = export_onnx(model, {"x": np.ones((2, 4), np.float32)}, dynamo=False, opset=17)
    params = [i.name for i in exported.graph.initializer]
    with pytest.raises(InvalidValueError, match="no repeated block"):
        generate_artifacts(
            exported, requires_grad=params, loss=LossType.MSELoss, artifact_directory=tmp_path / "a",
            recompute="layers",
        )  # fmt: skip
    artifacts = generate_artifacts(
        exported, requires_grad=params, loss=LossType.MSELoss, artifact_directory=tmp_path / "b",
        recompute=["0"],
    )  # fmt: skip
    training = onnx.load(artifacts.training_model, load_external_data=False)
    assert any("_recompute" in n.name for n in training.graph.node)


def test_the_cli_takes_module_paths_or_a_policy(tmp_path, capsys) -> None:
    from onnxblocks.cli import EXIT_INPUT, EXIT_OK, main

    inner = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.SiLU())
    model = torch.nn.Sequential(inner, torch.nn.Linear(8, 3))
    onnx.save(
        export_onnx(model, {"x": np.ones((2, 4), np.float32)}, dynamo=False, opset=17),
        tmp_path / "m.onnx",
    )
    common = ["artifacts", str(tmp_path / "m.onnx"), "--loss", "mse", "--all-params"]
    assert main([*common, "--recompute", "0,", "-o", str(tmp_path / "a")]) == EXIT_OK
    training = onnx.load(tmp_path / "a" / "training_model.onnx", load_external_data=False)
    assert any("_recompute" in n.name for n in training.graph.node)
    capsys.readouterr()
    assert main([*common, "--recompute", "layers", "-o", str(tmp_path / "b")]) == EXIT_INPUT
    assert "no repeated block" in capsys.readouterr().err


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return x + torch.nn.functional.silu(self.drop(torch.tanh(self.fc(x))))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(), _Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_dropout_inside_a_layer_is_kept_not_recomputed(tmp_path) -> None:
    torch.manual_seed(0)
    exported = export_onnx(
        _Stack().train(), {"x": np.ones((2, 8), np.float32)}, dynamo=False, opset=17
    )
    params = [i.name for i in exported.graph.initializer]
    artifacts = generate_artifacts(
        exported, requires_grad=params, loss=LossType.MSELoss, artifact_directory=tmp_path,
        recompute="layers",
    )  # fmt: skip
    training = onnx.load(artifacts.training_model, load_external_data=False)
    nodes = training.graph.node
    dropouts = [n for n in nodes if n.op_type == "Dropout"]
    assert len(dropouts) == 2, [n.op_type for n in nodes]
    clones = [n for n in nodes if "_recompute" in n.name]
    assert clones and not [n for n in clones if n.op_type == "Dropout"]
    kept = {o for n in dropouts for o in n.output if o}
    read = {i for n in clones for i in n.input} | {
        i for n in nodes if n.op_type.endswith("Grad") for i in n.input
    }
    assert kept & read, "neither the clones nor the backward read the forward's dropout"
