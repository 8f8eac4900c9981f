"""The command line refuses bad data, paths and options before training, with exit codes and one-line errors.

Each test is one bad input or environment, asserting the exact behaviour: the exception type, the offender
it names, and the directory before and after.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from support.runtime_support import PARAMS, classification_data, generate, listing, mlp_model

from onnxblocks.checkpoint import (
    load_checkpoint,
)
from onnxblocks.cli import EXIT_INPUT, EXIT_OK, EXIT_USAGE, main
from onnxblocks.runtime import TrainingSession


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """MLP classifier artifacts (2 -> 16 -> 3, fused cross entropy, AdamW)."""
    return generate(tmp_path_factory.mktemp("art"))


# =========================================================================== the command line
@pytest.fixture
def data(tmp_path):
    x, y = classification_data()
    np.savez(tmp_path / "train.npz", x=x, labels=y)
    return tmp_path / "train.npz"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("bad", [3, -1, 10**9])
def test_cli_refuses_labels_out_of_range_before_training(art, tmp_path, capsys, bad):
    x, y = classification_data()
    y = y.copy()
    y[9] = bad
    np.savez(tmp_path / "bad.npz", x=x, labels=y)
    before = listing(tmp_path)
    code, out, err = run_cli(
        capsys, "train", art, "--data", tmp_path / "bad.npz", "--save", tmp_path / "ck"
    )
    assert code == EXIT_INPUT and out == ""
    assert (
        f"input 'labels' holds {bad} at position (9,)" in err
        and "[0, 3)" in err
        and "bad.npz" in err
    )
    assert listing(tmp_path) == before  # nothing trained, nothing saved


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--export", ".", "is a directory"),
        ("--save", "file/ck", "is a file, not a directory"),
        ("--plot", "file/loss.svg", "is a file, not a directory"),
        ("--history", "file/h.json", "is a file, not a directory"),
    ],
)
def test_cli_output_path_problems_exit_3_before_training(
    art, data, tmp_path, capsys, monkeypatch, option, value, fragment
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_bytes(b"")
    before = listing(tmp_path)
    code, out, err = run_cli(capsys, "train", art, "--data", data, "--no-progress", option, value)
    assert code == EXIT_INPUT and out == "", err
    assert err.startswith(f"onnxblocks: error: {option}: ") and fragment in err
    assert listing(tmp_path) == before


@pytest.fixture
def read_only(tmp_path):
    """A directory nobody can create files in: mode 0555, and immutable (``chattr +i``) when running as root."""
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o555)
    if os.geteuid() == 0:  # root ignores modes: make it immutable (set up here; never skipped)
        done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
        assert done.returncode == 0, (
            f"cannot make a read-only directory as root with chattr +i: {done.stderr}"
        )
    yield directory
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    directory.chmod(0o755)


def test_cli_read_only_output_directory_exits_3_before_training(art, data, read_only, capsys):
    code, out, err = run_cli(
        capsys, "train", art, "--data", data, "--no-progress", "--save", read_only / "ck"
    )
    assert code == EXIT_INPUT and out == "", err
    assert f"--save: cannot write '{read_only / 'ck'}': directory '{read_only}' is read-only" in err
    assert listing(read_only) == []
    with pytest.raises(PermissionError, match="is read-only"):
        TrainingSession(art).save_checkpoint(read_only / "ck")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--lr", "nan"], "--lr must be a finite number >= 0, got nan"),
        (["--lr", "-1"], "--lr must be a finite number >= 0, got -1.0"),
        (["--lr", "1e40"], "past float32"),
        (["--max-steps", "0"], "--max-steps must be >= 1"),
        (["--gamma", "0"], "--gamma must be > 0"),
        (["--seed", "-3"], "--seed must be >= 0"),
        (["--save-every", "0", "--save", "ck"], "--save-every must be >= 1"),
        (["--batch-size", "abc"], "invalid int value: 'abc'"),
    ],
)
def test_cli_numeric_options_are_validated(art, data, capsys, args, fragment):
    code, out, err = run_cli(capsys, "train", art, "--data", data, *args)
    assert code == EXIT_USAGE and fragment in err and out == ""


def test_cli_artifacts_output_dir_that_is_a_file(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(mlp_model().SerializeToString())
    (tmp_path / "out").write_bytes(b"")
    code, _, err = run_cli(
        capsys, "artifacts", model, "--loss", "crossentropy", "--all-params", "-o", tmp_path / "out"
    )
    assert code == EXIT_INPUT and "--output-dir: " in err and "exists and is not a directory" in err
    assert (tmp_path / "out").read_bytes() == b""


def test_cli_trains_good_data(art, data, tmp_path, capsys):
    code, out, _ = run_cli(
        capsys, "train", art, "--data", data, "--no-progress", "--save", tmp_path / "new" / "ck"
    )
    assert code == EXIT_OK and "trained 2 steps" in out
    assert set(load_checkpoint(tmp_path / "new" / "ck").trainable) == set(PARAMS)


def test_cli_export_problems_are_found_before_training(art, data, tmp_path, capsys):
    args = [
        "train",
        art,
        "--data",
        data,
        "--no-progress",
        "--save",
        tmp_path / "ck",
        "--export",
        tmp_path / "m.onnx",
    ]
    code, out, err = run_cli(capsys, *args, "--export-output", "logit")
    assert (
        code == EXIT_INPUT
        and out == ""
        and "--export-output 'logit' is not a value of the eval model" in err
    )
    assert "Did you mean 'logits'?" in err and listing(tmp_path) == ["train.npz"]
