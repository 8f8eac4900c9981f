"""``onnxblocks demo --lora``: the fine-tune adapts the pre-trained LM, the files load, the CLI runs it in a child Python."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from support.numerics import assert_close

from onnxblocks.cli import main
from onnxblocks.runtime import TrainingSession
from onnxblocks.torch import (
    lora_demo,
)  # the test extra (torch==2.13.0): fails, never skips, without it


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = io.StringIO()
    result = lora_demo.run_lora_demo(tmp_path_factory.mktemp("lora-demo"), stream=out)
    return result, out.getvalue()


def test_the_fine_tune_learns_the_shifted_task(demo):
    result, report = demo
    assert result.passed and result.loss_after <= lora_demo.TARGET_RATIO * result.loss_before
    assert result.follows_new_task >= 0.9  # the merged model counts by two
    assert (
        lora_demo._fraction(result.prompts, result.base_continuations, lora_demo.PRETRAIN_STRIDE)
        >= 0.9
    )
    assert result.trainable == 2 * 4 * 8 * (32 + 32) - 2 * 2 * 8 * (
        32 - 16
    )  # r=8 on q, k, v ([32->32, 32->16]), o
    for role, path in result.files.items():
        assert path.exists() and str(path) in report, role
    assert "loss" in report and "merged model" in report


def test_the_demo_files_load_back(demo):
    """The PEFT directory loads into a session of the artifacts; the merged model equals the session's logits."""
    import onnxruntime as ort

    result, _ = demo
    config = json.loads((result.files["PEFT adapters"] / "adapter_config.json").read_text())
    assert config["r"] == 8 and sorted(config["target_modules"]) == sorted(lora_demo.TARGETS)
    session = TrainingSession(result.files["artifacts"])
    session.load_adapters(result.files["PEFT adapters"])
    ids = lora_demo.counting(np.random.default_rng(7), 16, 2)[:, :-1]
    _, logits = session.eval_step(ids, ids)
    merged = ort.InferenceSession(
        str(result.files["merged model"]), providers=["CPUExecutionProvider"]
    )
    # the merged model against the session: two float32 computations of ours, neither the truth
    assert_close(
        merged.run(["logits"], {"input_ids": ids})[0],
        logits,
        rtol=1e-5,
        name="the merged model's logits",
    )


def test_cli_runs_the_demo_in_a_child_python(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda command, check: calls.append(command) or subprocess.CompletedProcess(command, 0),
    )
    assert (
        main(["demo", "--lora", "--output-dir", str(tmp_path / "d"), "--seed", "3", "--portable"])
        == 0
    )
    assert calls == [
        [
            sys.executable,
            "-m",
            "onnxblocks.torch.lora_demo",
            "--output-dir",
            str(tmp_path / "d"),
            "--seed",
            "3",
            "--portable",
        ]
    ]
    assert (
        main(["demo", "--lora", "--web", "--port", "0", "--output-dir", str(tmp_path / "w")]) == 0
    )
    assert calls[-1][2] == "onnxblocks.torch.lora_web" and calls[-1][-2:] == ["--port", "0"]
    monkeypatch.setattr(
        subprocess, "run", lambda command, check: subprocess.CompletedProcess(command, 1)
    )
    assert main(["demo", "--lora", "--output-dir", str(tmp_path / "d")]) == 1


def test_cli_says_what_the_demo_needs(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else real(name, *a),
    )
    assert main(["demo", "--lora", "--output-dir", str(tmp_path / "d")]) == 1
    assert "pip install transformers" in capsys.readouterr().err
