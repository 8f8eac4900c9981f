"""The command line is quiet, and its exit codes are the documented ones.

* docs/cli.md's exit-code table, the constants of ``onnxblocks.cli.errors``, the
  module docstring of ``onnxblocks.cli.app`` and ``--help``'s epilog agree (the table is pinned).
* Run as a real process (so ONNX Runtime's own stderr is seen), ``onnxblocks train`` on
  portable artifacts with a bad data file prints exactly one line to stderr and exits 3;
  a successful run prints nothing to stderr (no ONNX Runtime warnings, no escape codes);
  generation prints no shape-merge warning; ``ONNXBLOCKS_ORT_LOG_LEVEL`` brings ONNX
  Runtime's log back.
* Missing output directories are created (as docs/cli.md says).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from support.onnx_models import make_linear_model

from onnxblocks.cli import app, errors, main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
#: The documented table: code -> the first words of its meaning.
TABLE = {0: "success", 1: "runtime failure", 2: "usage error", 3: "input error", 130: "interrupted"}


def test_the_exit_code_table_is_the_same_in_docs_code_and_help():
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|$", DOCS.read_text(), flags=re.MULTILINE)
    documented = {int(code): meaning.strip() for code, meaning in rows}
    assert sorted(documented) == sorted(TABLE)
    for code, start in TABLE.items():
        assert documented[code].startswith(start), (code, documented[code])
    constants = {
        errors.EXIT_OK: "success",
        errors.EXIT_FAILURE: "runtime failure",
        errors.EXIT_USAGE: "usage error",
        errors.EXIT_INPUT: "input error",
        errors.EXIT_INTERRUPTED: "interrupted",
    }
    assert constants == TABLE
    assert (
        "corrupt" in documented[3] and ".npz" in documented[3]
    )  # a corrupt data file is an input error
    assert (
        "created" in DOCS.read_text().split("## Exit codes")[1].split("## ")[0]
    )  # missing output dirs
    for code in TABLE:
        assert re.search(rf"^{code}\s", app.__doc__ or "", flags=re.MULTILINE), code
        assert f"{code} " in app.EPILOG.split("exit codes:")[1]


def _cli(
    *args: object, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxblocks.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("quiet")
    onnx.save(make_linear_model(), root / "m.onnx")
    rng = np.random.default_rng(0)
    np.savez(
        root / "d.npz",
        x=rng.standard_normal((40, 8)).astype(np.float32),
        target=rng.random((40, 4), np.float32),
    )
    return root


def _artifacts(work: Path, name: str, *options: str) -> Path:
    """``work/name``: the linear model's artifacts (MSE, every parameter, ``options``), written
    here when the test that writes them did not run first (-m, -k, another worker)."""
    out = work / name
    if not out.exists():
        args = ["artifacts", str(work / "m.onnx"), "--loss", "mse", "--all-params", *options]
        assert main([*args, "-o", str(out)]) == 0
    return out


def test_generation_and_a_portable_training_run_print_nothing_to_stderr(work):
    for extra, directory in ((["--portable"], "portable"), (["--optimizer", "sgd"], "sgd")):
        done = _cli(
            "artifacts",
            work / "m.onnx",
            "--loss",
            "mse",
            "--all-params",
            "-o",
            work / directory,
            *extra,
        )
        assert done.returncode == 0 and done.stderr == "", (
            done.stderr
        )  # no 'Error merging shape info'
    for directory in (
        "portable",
        "sgd",
    ):  # the SGD optimizer model loaded by the training build: no warning
        done = _cli(
            "train", work / directory, "--data", work / "d.npz", "--no-progress", "--epochs", "2"
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == "" and "\x1b[" not in done.stdout, done.stderr


def test_bad_data_file_on_portable_artifacts_is_one_line_and_exit_3(work):
    _artifacts(work, "portable", "--portable")
    raw = (work / "d.npz").read_bytes()
    cases = {
        "truncated.npz": raw[: len(raw) // 2],
        "flipped.npz": raw[:70] + bytes([raw[70] ^ 0xFF]) + raw[71:],
        "not-npz.npz": b"plain text, not an archive",
    }
    rng = np.random.default_rng(1)
    np.savez(
        work / "wrong-shape.npz",
        x=rng.random((8, 9), np.float32),
        target=rng.random((8, 4), np.float32),
    )
    for name, content in cases.items():
        (work / name).write_bytes(content)
    for name in [*cases, "wrong-shape.npz"]:
        done = _cli("train", work / "portable", "--data", work / name, "--no-progress")
        lines = done.stderr.splitlines()
        assert done.returncode == 3, (name, done.stderr)
        assert len(lines) == 1 and lines[0].startswith("onnxblocks: error: "), (name, done.stderr)
        assert name in lines[0] or "input 'x'" in lines[0], lines[0]
        assert (
            "\x1b[" not in done.stderr
            and ".cc:" not in done.stderr
            and "Traceback" not in done.stderr
        )


def test_the_log_level_can_be_raised_by_environment(work):
    _artifacts(work, "sgd", "--optimizer", "sgd")
    done = _cli(
        "train",
        work / "sgd",
        "--data",
        work / "d.npz",
        "--no-progress",
        env={"ONNXBLOCKS_ORT_LOG_LEVEL": "0"},
    )
    assert (
        done.returncode == 0 and "onnxruntime" in done.stderr
    )  # ONNX Runtime's verbose log is back


def test_missing_output_directories_are_created(work, capsys):
    _artifacts(work, "portable", "--portable")
    out = work / "new" / "deeper"
    code = main(
        [
            "train",
            str(work / "portable"),
            "--data",
            str(work / "d.npz"),
            "--no-progress",
            "--save",
            str(out / "ck"),
            "--history",
            str(out / "h" / "history.json"),
            "--plot",
            str(out / "p" / "loss.svg"),
            "--export",
            str(out / "e" / "m.onnx"),
            "--export-output",
            "y",
        ]
    )
    assert code == 0, capsys.readouterr().err
    for path in ("ck", "h/history.json", "p/loss.svg", "e/m.onnx"):
        assert (out / path).is_file(), path
