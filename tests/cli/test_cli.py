"""The onnxblocks command line: results, tables, exit codes and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from support.runtime_support import classification_data, mlp_model

from onnxblocks.checkpoint import load_checkpoint
from onnxblocks.cli import EXIT_FAILURE, EXIT_INPUT, EXIT_OK, EXIT_USAGE, main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    onnx.save(mlp_model(), root / "mlp.onnx")
    x, y = classification_data(120)
    np.savez(root / "train.npz", x=x, labels=y)
    np.savez(root / "renamed.npz", features=x, y=y)
    np.savez(root / "float64.npz", x=x.astype(np.float64), labels=y)
    (root / "garbage.onnx").write_bytes(b"\x08\x01this is not a model")
    return root


@pytest.fixture(scope="module")
def artifacts_dir(files):
    out = files / "art"
    code = main(
        [
            "artifacts",
            str(files / "mlp.onnx"),
            "--loss",
            "crossentropy",
            "--requires-grad",
            "fc*.weight",
            "fc2.bias",
            "--frozen",
            "fc1.bias",
            "--additional-output",
            "logits",
            "-o",
            str(out),
        ]
    )
    assert code == EXIT_OK
    return out


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err, *fragments):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxblocks: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -------------------------------------------------------------- artifacts
def test_artifacts_selects_parameters_by_pattern(artifacts_dir):
    checkpoint = load_checkpoint(artifacts_dir / "checkpoint")
    assert list(checkpoint.trainable) == ["fc1.weight", "fc2.weight", "fc2.bias"]
    assert list(checkpoint.frozen) == ["fc1.bias"]
    assert sorted(p.name for p in artifacts_dir.iterdir()) == [
        "checkpoint",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "training_model.onnx",
    ]


def test_artifacts_all_params_minus_frozen(files, tmp_path, capsys):
    code, out, _ = run(
        capsys,
        "artifacts",
        files / "mlp.onnx",
        "--loss",
        "crossentropy",
        "--all-params",
        "--frozen",
        "*.bias",
        "--optimizer",
        "sgd",
        "--prefix",
        "p_",
        "-o",
        tmp_path,
    )
    assert code == EXIT_OK
    checkpoint = load_checkpoint(tmp_path / "p_checkpoint")
    assert list(checkpoint.trainable) == ["fc1.weight", "fc2.weight"]
    assert list(checkpoint.frozen) == ["fc1.bias", "fc2.bias"]
    assert "trainable: 2 parameters (320 B); frozen: 2 (76 B)" in out
    assert f"next: onnxblocks train {tmp_path} --prefix p_" in out


@pytest.mark.parametrize(
    ("argv", "code", "fragments"),
    [
        (["--loss", "mse"], EXIT_USAGE, ["--requires-grad PATTERN... or --all-params"]),
        (
            ["--loss", "mse", "--requires-grad", "fc3.*"],
            EXIT_INPUT,
            ["'fc3.*' matches no initializer", "fc1.weight"],
        ),
        (
            ["--loss", "mse", "--requires-grad", "fc1.wieght"],
            EXIT_INPUT,
            ["Did you mean 'fc1.weight'"],
        ),
        (
            ["--loss", "mse", "--all-params", "--frozen", "*"],
            EXIT_USAGE,
            ["no parameter left to train"],
        ),
        (
            ["--loss", "nope", "--all-params"],
            EXIT_USAGE,
            ["argument --loss: invalid choice: 'nope'", "see 'onnxblocks artifacts --help'"],
        ),
        (["--all-params"], EXIT_USAGE, ["--loss is required with a model file"]),
    ],
)
def test_artifacts_errors(files, tmp_path, capsys, argv, code, fragments):
    got, _, err = run(capsys, "artifacts", files / "mlp.onnx", "-o", tmp_path / "out", *argv)
    assert got == code
    assert_one_line_error(err, *fragments)
    assert not (tmp_path / "out").exists()


def test_artifacts_bad_model_files(files, tmp_path, capsys):
    code, _, err = run(
        capsys, "artifacts", files / "missing.onnx", "--loss", "mse", "--all-params", "-o", tmp_path
    )
    assert code == EXIT_INPUT
    assert_one_line_error(err, "missing.onnx", "does not exist")
    code, _, err = run(
        capsys, "artifacts", files / "garbage.onnx", "--loss", "mse", "--all-params", "-o", tmp_path
    )
    assert code == EXIT_INPUT
    assert_one_line_error(err, "as an ONNX model")


def test_verbose_prints_the_traceback(files, tmp_path, capsys):
    code, _, err = run(
        capsys,
        "artifacts",
        files / "garbage.onnx",
        "--loss",
        "mse",
        "--all-params",
        "-o",
        tmp_path,
        "--verbose",
    )
    assert code == EXIT_INPUT
    assert err.startswith("Traceback (most recent call last):")
    assert err.strip().splitlines()[-1].startswith("onnxblocks: error: ")


# ---------------------------------------------------------------- inspect
def test_inspect_artifact_directory(artifacts_dir, capsys):
    code, out, _ = run(capsys, "inspect", artifacts_dir)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert "  x       float32  [batch, 2]" in lines and "  labels  int64    [batch]" in lines
    assert any(line.split()[:2] == ["logits", "float32"] for line in lines)
    row = next(line.split() for line in lines if line.strip().startswith("fc1.bias"))
    assert row == ["fc1.bias", "float32", "[16]", "frozen", "16", "64", "B"]
    assert (
        "total: 4 parameters, 99 elements, 396 B; trainable 3 (83 elements, 332 B); frozen 1 (16 elements, 64 B)"
    ) in lines
    assert "optimizer state: none (fresh checkpoint)" in lines


def test_inspect_model_and_json(files, capsys):
    code, out, _ = run(capsys, "inspect", files / "mlp.onnx", "--json")
    assert code == EXIT_OK
    report = json.loads(out)
    assert report["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 2]}]
    assert [p["name"] for p in report["parameters"]] == [
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    assert report["totals"] == {"count": 4, "elements": 99, "bytes": 396}
    code, out, _ = run(capsys, "inspect", files / "mlp.onnx")
    assert "total: 4 parameters, 99 elements, 396 B" in out


def test_inspect_errors(files, capsys):
    code, _, err = run(capsys, "inspect", files / "nothing-here")
    assert code == EXIT_INPUT
    assert_one_line_error(err, "does not exist")
    code, _, err = run(capsys, "inspect", files / "garbage.onnx")
    assert code == EXIT_INPUT
    assert_one_line_error(err, "cannot read", "garbage.onnx")
    code, _, err = run(capsys, "inspect", files, "--prefix", "q_")
    assert code == EXIT_INPUT
    assert_one_line_error(err, "not a complete artifact directory")


# ------------------------------------------------------------------ train
def test_train_save_resume_export(files, artifacts_dir, tmp_path, capsys):
    common = [
        "train",
        artifacts_dir,
        "--data",
        files / "train.npz",
        "--batch-size",
        "16",
        "--lr",
        "0.02",
        "--scheduler",
        "cosine",
        "--warmup-steps",
        "3",
        "--no-progress",
        "--val-fraction",
        "0.25",
    ]
    code, out, _ = run(
        capsys,
        *common,
        "--epochs",
        "4",
        "--save",
        tmp_path / "full",
        "--accuracy",
        "--export",
        tmp_path / "model.onnx",
        "--plot",
        tmp_path / "loss.png",
        "--history",
        tmp_path / "h.json",
    )
    assert code == EXIT_OK, out
    assert "trained 24 steps (steps 1-24)" in out and "accuracy" in out
    history = json.loads((tmp_path / "h.json").read_text())
    assert len(history["losses"]) == 24 and history["epochs"][-1]["epoch"] == 4
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    exported = onnx.load(tmp_path / "model.onnx")
    assert [o.name for o in exported.graph.output] == ["logits"]
    # stop after 12 of the 24 steps (same 4-epoch schedule), resume from the checkpoint: bit-for-bit equal
    assert (
        run(capsys, *common, "--epochs", "4", "--max-steps", "12", "--save", tmp_path / "half")[0]
        == EXIT_OK
    )
    code, out, _ = run(
        capsys, *common, "--epochs", "4", "--resume", tmp_path / "half", "--save", tmp_path / "rest"
    )
    assert code == EXIT_OK and "trained 12 steps (steps 13-24)" in out
    full, rest = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "rest")
    for name in full.trainable:
        np.testing.assert_array_equal(full[name], rest[name])
    code, out, _ = run(capsys, "inspect", tmp_path / "rest")
    assert "optimizer state: saved (step 24)" in out


def test_train_maps_renamed_arrays(files, artifacts_dir, capsys):
    code, out, _ = run(
        capsys,
        "train",
        artifacts_dir,
        "--data",
        files / "renamed.npz",
        "--inputs",
        "x=features",
        "labels=y",
        "--no-progress",
        "--max-steps",
        "2",
    )
    assert code == EXIT_OK and "trained 2 steps" in out


@pytest.mark.parametrize(
    ("extra", "code", "fragments"),
    [
        (
            ["--data", "float64.npz"],
            EXIT_INPUT,
            ["input 'x' expects float32 with shape [batch, 2]; got float64", "astype(np.float32)"],
        ),
        (
            ["--data", "renamed.npz"],
            EXIT_INPUT,
            [
                "has arrays ['features', 'y'] but no array for model input(s) x",
                "--inputs INPUT=ARRAY",
            ],
        ),
        (
            ["--data", "renamed.npz", "--inputs", "z=features"],
            EXIT_INPUT,
            ["'z', which is not a model input"],
        ),
        (["--data", "missing.npz"], EXIT_INPUT, ["missing.npz' does not exist"]),
        (["--data", "train.npz", "--accuracy"], EXIT_USAGE, ["--accuracy needs evaluation data"]),
        (
            ["--data", "train.npz", "--eval-data", "train.npz", "--val-fraction", "0.1"],
            EXIT_USAGE,
            ["either"],
        ),
        (["--data", "train.npz", "--scheduler", "step"], EXIT_USAGE, ["--step-size"]),
        (["--data", "train.npz", "--batch-size", "0"], EXIT_USAGE, ["--batch-size must be >= 1"]),
        (
            ["--data", "train.npz", "--resume", "missing-ckpt"],
            EXIT_INPUT,
            ["missing-ckpt' does not exist"],
        ),
        (["--epochs", "2"], EXIT_USAGE, ["pass --data FILE.npz", "--text FILE.txt"]),
    ],
)
def test_train_errors(files, artifacts_dir, capsys, monkeypatch, extra, code, fragments):
    monkeypatch.chdir(files)
    got, _, err = run(capsys, "train", artifacts_dir, "--no-progress", *extra)
    assert got == code
    assert_one_line_error(err, *fragments)


def test_train_needs_an_optimizer_model(files, tmp_path, capsys):
    assert (
        run(
            capsys,
            "artifacts",
            files / "mlp.onnx",
            "--loss",
            "crossentropy",
            "--all-params",
            "--optimizer",
            "none",
            "-o",
            tmp_path,
        )[0]
        == EXIT_OK
    )
    code, _, err = run(capsys, "train", tmp_path, "--data", files / "train.npz")
    assert code == EXIT_INPUT
    assert_one_line_error(err, "have no optimizer model", "--optimizer adamw")


# ------------------------------------------------------------ help & codes
def test_help_documents_examples_and_exit_codes(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == EXIT_OK
    assert "exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 input error" in out
    for command in ("artifacts", "inspect", "train", "demo"):
        code, out, _ = run(capsys, command, "--help")
        assert code == EXIT_OK and "examples:" in out and f"onnxblocks {command}" in out
    code, _, err = run(capsys)
    assert code == EXIT_USAGE and "usage: onnxblocks" in err


def test_demo_that_misses_its_target_exits_1(tmp_path, capsys):
    code, _, err = run(capsys, "demo", "--output-dir", tmp_path, "--epochs", "1", "--no-progress")
    assert code == EXIT_FAILURE
    assert_one_line_error(err, "the target is 0.9", "Try more --epochs")


def test_subprocess_exit_code_and_single_error_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onnxblocks.cli", "inspect", str(tmp_path / "nope.onnx")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == EXIT_INPUT
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"onnxblocks: error: '{tmp_path / 'nope.onnx'}' does not exist; pass an .onnx file, an artifact directory "
        "or a checkpoint."
    ]
    result = subprocess.run(
        [sys.executable, "-m", "onnxblocks", "--version"], capture_output=True, text=True
    )
    assert result.returncode == EXIT_OK and result.stdout.startswith("onnxblocks ")
