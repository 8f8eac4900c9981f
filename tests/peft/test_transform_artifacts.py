"""generate_artifacts(lora=...) and ``onnxblocks artifacts --lora``: what trains, the record in every model,
dropout in the training graph only, and the CLI's spec and its errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from support.numerics import assert_close, is_close
from support.runtime_support import mlp_model

from onnxblocks import losses
from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.cli import EXIT_INPUT, EXIT_OK, EXIT_USAGE, main
from onnxblocks.errors import InvalidTypeError
from onnxblocks.peft import LoraConfig, apply_lora, lora_info
from onnxblocks.runtime import TrainingSession

ADAPTERS = ["fc1.lora_A.weight", "fc1.lora_B.weight", "fc2.lora_A.weight", "fc2.lora_B.weight"]
X = np.random.default_rng(0).standard_normal((16, 2)).astype(np.float32)


def _mlp_path(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    return path


@pytest.mark.parametrize("portable", [False, True])
def test_adapters_train_alone_and_every_model_records_them(tmp_path, portable):
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["fc1", "fc2"])
    artifacts = generate_artifacts(
        _mlp_path(tmp_path),
        loss=losses.CrossEntropyLoss(),
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "art",
        lora=config,
        portable=portable,
    )
    assert list(artifacts.requires_grad) == ADAPTERS and artifacts.frozen_params == ()
    checkpoint = load_checkpoint(artifacts.checkpoint)
    assert (
        list(checkpoint.trainable) == ADAPTERS and not checkpoint.frozen
    )  # the base stays in the graphs
    models = [artifacts.training_model, artifacts.eval_model] + (
        [artifacts.step_model] if portable else []
    )
    for path in models:
        info = lora_info(path)
        assert (
            info is not None and info.config == config and list(info.targets) == ["fc1", "fc2"]
        ), path
        base = {i.name for i in onnx.load(path, load_external_data=False).graph.initializer}
        assert {"fc1.weight", "fc2.weight"} <= base  # constants of the graph
    session = TrainingSession(artifacts.directory)
    labels = (X[:, 0] > 0).astype(np.int64)
    first = session.train_and_update(X, labels)[0]
    for _ in range(5):
        last = session.train_and_update(X, labels)[0]
    assert float(np.asarray(last)) < float(np.asarray(first))


def test_requires_grad_adds_to_the_adapters_and_a_prepared_model_trains_its_adapters(tmp_path):
    artifacts = generate_artifacts(
        mlp_model(),
        requires_grad=["fc2.bias"],
        loss=losses.CrossEntropyLoss(),
        artifact_directory=tmp_path / "a",
        lora=LoraConfig(r=2, target_modules=["fc1", "fc2"]),
    )
    assert sorted(artifacts.requires_grad) == sorted([*ADAPTERS, "fc2.bias"])
    prepared = apply_lora(mlp_model(), LoraConfig(r=2, target_modules=["fc2"]), seed=3)
    node = lora_info(prepared).targets["fc2"].node  # the unnamed Gemm got a name, for the record
    assert node and [n.op_type for n in prepared.graph.node if n.name == node] == ["Gemm"]
    again = generate_artifacts(
        prepared, loss=losses.CrossEntropyLoss(), artifact_directory=tmp_path / "b"
    )
    assert list(again.requires_grad) == ADAPTERS[2:]
    with pytest.raises(InvalidTypeError, match="lora must be an onnxblocks.peft.LoraConfig"):
        generate_artifacts(
            mlp_model(), loss=losses.CrossEntropyLoss(), artifact_directory=tmp_path, lora={"r": 2}
        )


def test_dropout_acts_in_the_training_graph_only(tmp_path):
    """With lora_dropout, the training graph drops the branch's input; the eval model gives the undropped output."""
    config = LoraConfig(
        r=2, lora_alpha=4, target_modules=["fc1"], lora_dropout=0.5, init_lora_weights=False
    )
    plain = apply_lora(
        mlp_model(), LoraConfig(r=2, lora_alpha=4, target_modules=["fc1"], init_lora_weights=False)
    )
    dropped = apply_lora(mlp_model(), config)
    assert [n.op_type for n in dropped.graph.node].count("Dropout") == 1
    assert [n.op_type for n in plain.graph.node].count("Dropout") == 0
    import onnxruntime as ort

    expected = ort.InferenceSession(plain.SerializeToString()).run(None, {"x": X})[0]
    train = ort.InferenceSession(dropped.SerializeToString()).run(None, {"x": X})[0]
    assert not is_close(train, expected, rtol=1e-3)  # the training-mode Dropout drops
    artifacts = generate_artifacts(
        mlp_model(),
        loss=losses.CrossEntropyLoss(),
        additional_output_names=["logits"],
        artifact_directory=tmp_path,
        lora=config,
    )
    session = TrainingSession(artifacts.directory)
    labels = np.zeros(len(X), dtype=np.int64)
    _, logits = session.eval_step(X, labels)
    assert_close(logits, expected, rtol=1e-5, name="logits")  # ONNX Runtime both: no float64 truth


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_lora_spec(tmp_path, capsys):
    model = _mlp_path(tmp_path)
    spec = "r=2,alpha=4,targets=fc1,fc2,dropout=0.1"
    code, out, _ = _cli(
        capsys, "artifacts", model, "--loss", "crossentropy", "--lora", spec, "-o", tmp_path / "a"
    )
    assert code == EXIT_OK
    assert "trainable: 4 parameters" in out
    info = lora_info(tmp_path / "a" / "training_model.onnx")
    assert info is not None and (
        info.config.r,
        info.config.lora_alpha,
        info.config.lora_dropout,
    ) == (2, 4, 0.1)
    assert info.config.target_modules == ("fc1", "fc2")
    code, _, _ = _cli(
        capsys, "artifacts", model, "--loss", "crossentropy", "--lora", "r=2,targets=fc2", "--requires-grad",
        "fc1.bias", "-o", tmp_path / "b",
    )  # fmt: skip
    assert code == EXIT_OK
    assert sorted(load_checkpoint(tmp_path / "b" / "checkpoint").trainable) == sorted(
        [*ADAPTERS[2:], "fc1.bias"]
    )


@pytest.mark.parametrize(
    ("spec", "code", "fragment"),
    [
        ("rank=2,targets=fc1", EXIT_USAGE, "unknown key 'rank'"),
        ("r=x,targets=fc1", EXIT_USAGE, "r='x' must be an int"),
        ("r=2", EXIT_USAGE, "targets=NAME"),
        (
            "r=2,targets=fc1,dropout=2",
            EXIT_USAGE,
            "--lora dropout: LoraConfig lora_dropout must be in [0, 1)",
        ),
        ("r=0,targets=fc1", EXIT_USAGE, "--lora r: LoraConfig r must be at least 1"),
        ("r=2,alpha=-1,targets=fc1", EXIT_USAGE, "--lora alpha:"),
        ("r=2,targets=fc1,fan_in_fan_out=yes", EXIT_USAGE, "fan_in_fan_out='yes' must be 0 or 1"),
        ("fc1,r=2", EXIT_USAGE, "'fc1' is not KEY=VALUE"),
        ("r=2,targets=nothing", EXIT_INPUT, "target_modules=['nothing'] matches no module"),
    ],
)
def test_cli_lora_errors_name_the_key(tmp_path, capsys, spec, code, fragment):
    got, _, err = _cli(
        capsys,
        "artifacts",
        _mlp_path(tmp_path),
        "--loss",
        "crossentropy",
        "--lora",
        spec,
        "-o",
        tmp_path / "out",
    )
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], err
    assert not (tmp_path / "out").exists()
