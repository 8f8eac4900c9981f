"""``onnxblocks artifacts`` with the torch.optim family's options and the no-decay parameter groups."""

from __future__ import annotations

import json

import onnx
import pytest
from support.runtime_support import mlp_model

from onnxblocks._core.contracts import OPTIMIZER_METADATA
from onnxblocks.cli import EXIT_OK, EXIT_USAGE, main


def _metadata(directory) -> dict:
    model = onnx.load(directory / "optimizer_model.onnx")
    return json.loads(next(p.value for p in model.metadata_props if p.key == OPTIMIZER_METADATA))


def test_no_decay_norm_bias_puts_biases_in_a_group_without_weight_decay(tmp_path) -> None:
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    args = ["artifacts", str(tmp_path / "mlp.onnx"), "--loss", "crossentropy", "--all-params", "-o"]
    code = main(
        [
            *args,
            str(tmp_path / "a"),
            "--optimizer",
            "adamw",
            "--weight-decay",
            "0.05",
            "--no-decay-norm-bias",
        ]
    )
    assert code == EXIT_OK
    meta = _metadata(tmp_path / "a")
    assert meta["algorithm"] == "adamw"
    assert [g["hyper"]["weight_decay"] for g in meta["groups"]] == [0.05, 0.0]
    assert dict(meta["params"]) == {"fc1.weight": 0, "fc1.bias": 1, "fc2.weight": 0, "fc2.bias": 1}
    assert (
        main([*args, str(tmp_path / "b"), "--optimizer", "sgd", "--momentum", "0.9", "--nesterov"])
        == EXIT_OK
    )
    assert _metadata(tmp_path / "b")["groups"][0]["hyper"] == {
        "momentum": 0.9,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": True,
        "maximize": False,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--optimizer", "adam", "--nesterov"], "--optimizer adam takes no --nesterov"),
        (["--optimizer", "sgd", "--nesterov"], "SGD: nesterov momentum requires a momentum > 0"),
        (["--optimizer", "rmsprop", "--momentum", "-1"], "momentum must be a finite number >= 0"),
    ],
)
def test_options_an_optimizer_does_not_take_are_refused(tmp_path, capsys, options, message) -> None:
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    args = [
        "artifacts",
        str(tmp_path / "mlp.onnx"),
        "--loss",
        "crossentropy",
        "--all-params",
        "-o",
        str(tmp_path / "o"),
    ]
    assert main([*args, *options]) == EXIT_USAGE
    assert message in capsys.readouterr().err
