"""``recompute="auto"`` and byte budgets: the blocks chosen fit the static estimate in the budget.

The planner (``gradient/recompute_plan.py``) is checked on its own over block sizes (the
largest blocks first, the fewest that fit, one recomputed block's activations counted at a
time, blocks' order), then through ``generate_artifacts`` on the tiny LLaMA, GPT-2 and BERT configs of
``test_recompute.py``: a budget of the estimate without recomputation recomputes nothing, the
least a budget can be is met, a budget between recomputes some, each choice's
estimate within its budget; a budget below the least is refused naming ``recompute``. A partial
choice trains bit-identically to ``recompute="none"`` (three AdamW steps, training build).
"""

from __future__ import annotations

import copy
import logging
import re

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from support import hf_families
from support.numerics import assert_equal
from support.torch_export import export_onnx
from test_recompute import _family, _train

from onnxblocks.artifacts import generate_artifacts
from onnxblocks.errors import InvalidTypeError, InvalidValueError, OnnxBlocksError
from onnxblocks.gradient.recompute_plan import plan


def _values(*sizes: int) -> list[ir.Value]:
    return [
        ir.Value(name=f"v{i}", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([n // 4]))
        for i, n in enumerate(sizes)
    ]


def test_the_planner_recomputes_the_blocks_that_lower_the_peak_most() -> None:
    blocks = {"a": _values(400), "b": _values(1000, 200), "c": _values(800)}
    fixed = _values(100)
    # forward order a, b, c; the backward frees c, then b, then a. Nothing recomputed: 2500.
    # b alone: 100 + max(a + c, a + b while b's backward runs) = 1700 (c alone: 2500, a: 2100);
    # a and b: 100 + max(c, b) = 1300, as all three.
    assert plan(blocks, fixed, 2500, strict=True).chosen == ()
    got = plan(blocks, fixed, 1700, strict=True)
    assert got.chosen == ("b",) and got.estimate == 1700 and got.without == 2500
    got = plan(blocks, fixed, 1699, strict=True)
    assert got.chosen == ("a", "b") and got.estimate == 1300
    with pytest.raises(InvalidValueError, match=r"recompute=1299 .*recompute=1300"):
        plan(blocks, fixed, 1299, strict=True)
    assert plan(blocks, fixed, 1, strict=False).chosen == ("a", "b", "c")


@pytest.mark.parametrize(
    ("budget", "error", "match"),
    [
        (0, InvalidValueError, "byte budget"),
        (-5, InvalidValueError, "byte budget"),
        (True, InvalidTypeError, "byte budget"),
        (1.5, InvalidTypeError, "byte budget"),
        ("lots", InvalidValueError, "'auto'"),
    ],
)
def test_bad_budgets_are_refused_naming_recompute(budget, error, match, tmp_path) -> None:
    import torch

    linear = torch.nn.Linear(2, 2)
    model = export_onnx(linear, {"x": np.ones((1, 2), np.float32)}, dynamo=False, opset=17)
    with pytest.raises(error, match=match) as caught:
        generate_artifacts(model, loss=None, artifact_directory=tmp_path, recompute=budget)
    assert isinstance(caught.value, OnnxBlocksError)
    assert "recompute" in str(caught.value)
    assert not list(tmp_path.iterdir())


def _initializers(model: onnx.ModelProto) -> list[np.ndarray]:
    return [onnx.numpy_helper.to_array(i) for i in model.graph.initializer]


def _generate(family, exported, directory, recompute, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="onnxblocks.gradient.recompute"):
        artifacts = generate_artifacts(
            exported,
            requires_grad=list(hf_families.trainable(family, exported).values()),
            loss=hf_families.onnxblocks_loss(family),
            artifact_directory=directory,
            recompute=recompute,
        )
    found = re.search(r"budget (\d+) bytes, estimate (\d+) bytes kept \((\d+) without", caplog.text)
    assert found, caplog.text
    training = onnx.load(artifacts.training_model, load_external_data=False)
    blocks = {n.name.split("/Size")[0] for n in training.graph.node if "/Size_recompute" in n.name}
    return [int(g) for g in found.groups()], blocks


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert"])
def test_a_budget_chooses_blocks_whose_estimate_fits(kind, tmp_path, caplog) -> None:
    family = _family(kind)
    exported = export_onnx(copy.deepcopy(family.model), family.inputs, dynamo=False, opset=17)
    (budget, estimate, without), blocks = _generate(
        family, exported, tmp_path / "a", "auto", caplog
    )
    assert estimate <= budget or len(blocks) == 2, (budget, estimate, blocks)
    with pytest.raises(InvalidValueError, match=r"recompute=1 .*Pass recompute=(\d+)") as caught:
        _generate(family, exported, tmp_path / "b", 1, caplog)
    least = int(re.search(r"Pass recompute=(\d+)", str(caught.value)).group(1))
    assert least < without
    (_, estimate, _), blocks = _generate(family, exported, tmp_path / "c", without, caplog)
    assert estimate == without and not blocks
    (_, estimate, _), blocks = _generate(family, exported, tmp_path / "d", least, caplog)
    assert estimate == least and blocks
    (_, estimate, _), blocks = _generate(family, exported, tmp_path / "e", without - 1, caplog)
    assert estimate <= without - 1 and len(blocks) == 1


def test_a_partial_choice_trains_like_no_recomputation(tmp_path, caplog) -> None:
    family = _family("llama")
    exported = export_onnx(copy.deepcopy(family.model), family.inputs, dynamo=False, opset=17)
    (_, _, without), _ = _generate(family, exported, tmp_path / "probe", "auto", caplog)
    options = {"portable": False, "lora": False}
    losses, params, _ = _train(family, exported, tmp_path / "none", recompute="none", **options)
    got_losses, got_params, graph = _train(
        family, exported, tmp_path / "budget", recompute=without - 1, **options
    )
    triggers = {n.name.split("/Size")[0] for n in graph.graph.node if "/Size_recompute" in n.name}
    assert len(triggers) == 1, triggers
    assert losses[-1] < losses[0]
    assert_equal(got_losses, losses, name="losses")
    for name, value in params.items():
        assert_equal(got_params[name], value, name=name)


def test_the_cli_takes_auto_and_a_byte_budget(tmp_path, capsys) -> None:
    import torch

    from onnxblocks.cli import EXIT_INPUT, main

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    onnx.save(
        export_onnx(model, {"x": np.ones((2, 4), np.float32)}, dynamo=False, opset=17),
        tmp_path / "m.onnx",
    )
    common = ["artifacts", str(tmp_path / "m.onnx"), "--loss", "mse", "--all-params"]
    assert main([*common, "--recompute", "auto", "-o", str(tmp_path / "a")]) == EXIT_INPUT
    assert "recompute='auto' found no repeated block" in capsys.readouterr().err
    assert main([*common, "--recompute", "0", "-o", str(tmp_path / "b")]) == EXIT_INPUT
    assert "byte budget" in capsys.readouterr().err
