"""Weights the exporter tied: found, listed, warned about and untied; the model's own ties kept.

TorchScript (with or without constant folding, in eval mode) and dynamo's optimizer merge identical
initializers: the fresh norm weights of a LLaMA (all ones) become one initializer, which training then ties
(one value, one gradient for three modules). The family: LLaMA and GPT-2 from TorchScript folded and unfolded
and dynamo with and without its optimizer; a model that calls one module twice; GPT-2's tied ``lm_head`` and
``wte`` (the model's own tie) and the ``tie_word_embeddings`` metadata that overrides the rule. ``untie=True``
trains like torch (4 AdamW steps, float32 and float64 references); without it generation warns and the tied
norms drift from torch.
"""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from support import hf_families
from support.export_cache import shared_export
from support.numerics import assert_close, is_close
from support.user_exports import EXPORTS, export, initializers
from torch import nn

from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.artifacts.ties import TIE_METADATA, find_ties, untie
from onnxblocks.cli import EXIT_OK, main
from onnxblocks.errors import UnknownNameError
from onnxblocks.runtime import TrainingSession

STEPS, LR = 4, 1e-3
LLAMA_NORMS = (
    "model.model.layers.0.input_layernorm",
    "model.model.layers.0.post_attention_layernorm",
    "model.model.norm",
)


def _exported(name: str, how: str):
    """The family (the same weights every call) and its export ``how``, exported once per module."""
    family = hf_families.make(name)
    return family, shared_export(
        (__name__, name, how), lambda: export(family.model, family.inputs, how)
    )


@pytest.mark.parametrize("how", EXPORTS)
def test_llama_norms_merged_by_the_exporter_are_found_with_the_names_untie_gives_them(how):
    _, model = _exported("llama", how)
    ties = [t for t in find_ties(model) if not t.by_model]
    if how == "dynamo":  # without its optimizer, dynamo keeps every parameter
        assert ties == []
        return
    (tie,) = ties
    assert tie.initializer == "model.model.layers.0.input_layernorm.weight"
    assert tie.modules[0] == LLAMA_NORMS[0] and sorted(tie.modules) == sorted(LLAMA_NORMS)
    assert sorted(tie.copies) == sorted(f"{m}.weight" for m in LLAMA_NORMS[1:])
    untied, undone = untie(model)
    assert [t.initializer for t in undone] == [tie.initializer] and find_ties(untied) == []
    names = {i.name for i in untied.graph.initializer}
    assert {f"{m}.weight" for m in LLAMA_NORMS} <= names
    assert [i.name for i in model.graph.initializer if "norm" in i.name] == [
        tie.initializer
    ]  # model unchanged


@pytest.mark.parametrize("how", ["ts-unfolded", "dynamo"])
def test_gpt2_keeps_its_own_tie_of_lm_head_and_wte(how):
    _, model = _exported("gpt2", how)
    ties = find_ties(model)
    own = [t for t in ties if t.by_model]
    assert len(own) == 1 and {m.rsplit(".", 1)[-1] for m in own[0].modules} == {"wte", "lm_head"}
    untied, _ = untie(model)
    assert [t.initializer for t in find_ties(untied)] == [
        own[0].initializer
    ]  # kept, every other tie undone
    declared = copy.deepcopy(model)
    onnx.helper.set_model_props(
        declared, {TIE_METADATA: "false"}
    )  # the config says the model ties nothing
    assert not [t for t in find_ties(declared) if t.by_model]


def test_one_module_called_twice_is_no_tie_two_merged_modules_are():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(self.block(self.block(x)))

    torch.manual_seed(0)
    inputs = {"x": np.ones((2, 4), np.float32)}
    for how in EXPORTS:
        ties = find_ties(export(Model(), inputs, how))
        expected = (
            [] if how == "dynamo" else [("block.1", "norm")] * 2
        )  # the LayerNorms' weight and bias
        assert [t.modules for t in ties] == expected, how


def _torch_steps(family, dtype) -> tuple[list[float], dict[str, np.ndarray]]:
    model = copy.deepcopy(family.model).to(dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    args = [torch.from_numpy(v) for v in family.inputs.values()]
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = hf_families.torch_loss(family, model(*args))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {n: p.detach().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("how", ["ts-folded", "dynamo-optimized"])
def test_untied_llama_trains_like_torch_and_the_tied_one_warns_and_drifts(how, tmp_path):
    family, model = _exported("llama", how)
    before = model.SerializeToString()
    names = initializers(model, family.model, lambda n: True)
    requires = sorted({o for o, _ in names.values()})
    batch = [*family.inputs.values(), family.target]
    expected, expected_params = _torch_steps(family, torch.float32)
    expected64, expected64_params = _torch_steps(family, torch.float64)
    runs = {}
    for untied in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            artifacts = generate_artifacts(
                model, requires_grad=requires, loss=hf_families.onnxblocks_loss(family), optimizer=OptimType.AdamW,
                artifact_directory=tmp_path / str(untied), untie=untied,
            )  # fmt: skip
        warned = [w for w in caught if "untie=True" in str(w.message)]
        assert bool(warned) != untied, [str(w.message) for w in caught]
        if warned:
            assert warned[0].filename == __file__ and "input_layernorm.weight" in str(
                warned[0].message
            )
        session = TrainingSession(artifacts.directory)
        session.learning_rate = LR
        losses = [
            float(np.asarray(session.train_and_update(*batch)[0]).reshape(-1)[0])
            for _ in range(STEPS)
        ]
        runs[untied] = (losses, session.parameters(), artifacts)
    assert model.SerializeToString() == before  # the caller's model is not changed
    losses, params, artifacts = runs[True]
    assert {f"{m}.weight" for m in LLAMA_NORMS} <= set(artifacts.requires_grad)
    assert_close(
        np.array(losses), np.array(expected), np.array(expected64), rtol=1e-6, name="losses"
    )
    for name, (onnx_name, transposed) in names.items():
        value = params[name if name in params else onnx_name]
        value = value.T if transposed else value
        # AdamW moves each element by about LR a step: its float32 rounding is measured in those steps
        scale = np.abs(expected64_params[name]) + LR * STEPS
        assert_close(
            value, expected_params[name], expected64_params[name], rtol=1e-4, scale=scale, name=name
        )
    tied_losses, tied_params, _ = runs[False]
    norms = {
        n: v
        for n, v in expected64_params.items()
        if n.startswith(LLAMA_NORMS) and n.endswith("weight")
    }
    drift = max(float(np.max(np.abs(tied_params[names[n][0]] - v))) for n, v in norms.items())
    assert drift > 1e-3, (
        f"the tied norms follow torch ({drift:.3g}; 7.7e-3 measured): the test lost its case"
    )
    assert not is_close(np.array(tied_losses), np.array(expected), np.array(expected64), rtol=1e-6)


def test_a_merged_module_name_without_untie_says_to_untie(tmp_path):
    family, model = _exported("llama", "ts-folded")
    with pytest.raises(UnknownNameError, match="untie=True"):
        generate_artifacts(
            model, requires_grad=["model.model.norm.weight"], loss=hf_families.onnxblocks_loss(family),
            artifact_directory=tmp_path,
        )  # fmt: skip


def test_gpt2_trains_its_own_tie_without_a_warning_and_untie_keeps_it(tmp_path):
    family, model = _exported("gpt2", "dynamo")
    requires = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no tie warning
        artifacts = generate_artifacts(
            model, requires_grad=requires, loss=hf_families.onnxblocks_loss(family), optimizer=OptimType.AdamW,
            artifact_directory=tmp_path, untie=True,
        )  # fmt: skip
    (own,) = find_ties(
        onnx.load(artifacts.eval_model, load_external_data=False), artifacts.requires_grad
    )
    assert own.by_model and own.initializer in artifacts.requires_grad
    assert not [
        n for n in artifacts.requires_grad if n.endswith("wte.weight")
    ]  # one parameter for both


def test_inspect_lists_the_ties_and_the_cli_unties(tmp_path, capsys):
    _, model = _exported("llama", "ts-folded")
    path = tmp_path / "llama.onnx"
    onnx.save(model, path)
    assert main(["inspect", str(path), "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    (tie,) = report["ties"]
    assert (
        tie["initializer"] == "model.model.layers.0.input_layernorm.weight" and not tie["by_model"]
    )
    assert sorted(tie["modules"]) == sorted(LLAMA_NORMS)
    assert main(["inspect", str(path)]) == EXIT_OK
    text = capsys.readouterr().out
    assert "tied by the exporter" in text and "--untie" in text
    out = tmp_path / "artifacts"
    argv = [
        "artifacts",
        str(path),
        "--loss",
        "crossentropy",
        "--all-params",
        "--untie",
        "-o",
        str(out),
    ]
    assert main(argv) == EXIT_OK
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == EXIT_OK
    trained = {
        p["name"]
        for p in json.loads(capsys.readouterr().out)["parameters"]
        if p["status"] == "trainable"
    }
    assert {f"{m}.weight" for m in LLAMA_NORMS} <= trained
