"""The CLI's language-model road: ``artifacts HUB_DIR``, cross-entropy options, ``train --text``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.numerics import assert_close
from support.optimum_env import optimum_export

from onnxblocks.cli import EXIT_OK, EXIT_USAGE, main
from onnxblocks.hub import read_record
from onnxblocks.runtime import TrainingSession

TEXT = "the cat sat on the mat\n\nthe dog ran to the cat and it was\n\nshe ran in the mat\n" * 8


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def hub():
    return optimum_export("llama", with_past=True)


def test_artifacts_from_a_hub_folder_with_lora_then_train_on_text(hub, tmp_path, capsys):
    art = tmp_path / "art"
    code, out, err = run(
        capsys, "artifacts", hub, "--task", "causal-lm", "--lora", "r=4,alpha=8,targets=q_proj",
        "-o", art,
    )  # fmt: skip
    assert code == EXIT_OK, err
    assert "task: causal-lm (with past key values)" in out
    assert read_record(art).with_past
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    history = tmp_path / "history.json"
    code, out, err = run(
        capsys, "train", art, "--text", corpus, "--tokenizer", hub, "--seq-len", "8",
        "--batch-size", "4", "--epochs", "2", "--lr", "0.01", "--no-progress", "--history", history,
    )  # fmt: skip
    assert code == EXIT_OK, err
    losses = [e["loss"] for e in json.loads(history.read_text())["epochs"]]
    assert len(losses) == 2 and losses[1] < losses[0], losses


def test_shift_labels_on_a_model_file_is_transformers_loss(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    plain = optimum_export("llama", with_past=False)
    code, _, err = run(
        capsys, "artifacts", plain / "onnx" / "model.onnx", "--loss", "crossentropy",
        "--shift-labels", "--all-params", "--loss-input", "logits", "-o", tmp_path / "art",
    )  # fmt: skip
    assert code == EXIT_OK, err
    session = TrainingSession(tmp_path / "art")
    rng = np.random.default_rng(3)
    ids = rng.integers(7, 27, size=(2, 6), dtype=np.int64)
    labels = ids.copy()
    labels[1, -2:] = -100
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.tile(np.arange(6, dtype=np.int64), (2, 1)),
        "labels": labels,
    }
    loss = session.eval_step(*[feeds[n] for n in session.eval_input_names])[0]
    expected = []
    for dtype in (torch.float32, torch.float64):
        model = AutoModelForCausalLM.from_pretrained(plain, dtype=dtype).eval()
        with torch.no_grad():
            expected.append(
                float(model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(labels)).loss)
            )
    assert_close(np.float32(loss), np.float32(expected[0]), np.float64(expected[1]), rtol=1e-5)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--loss", "mse", "--shift-labels", "--all-params"], "not --loss mse"),
        (["--task", "causal-lm", "--loss", "mse", "--all-params"], "hub folder as MODEL"),
    ],
)
def test_option_mistakes_are_usage_errors(tmp_path, capsys, argv, fragment):
    plain = optimum_export("llama", with_past=False)
    code, _, err = run(capsys, "artifacts", plain / "onnx" / "model.onnx", "-o", tmp_path, *argv)
    assert code == EXIT_USAGE and fragment in err, err


def test_text_needs_a_tokenizer_and_a_length(hub, tmp_path, capsys):
    run(capsys, "artifacts", hub, "-o", tmp_path / "art")
    (tmp_path / "c.txt").write_text(TEXT)
    code, _, err = run(capsys, "train", tmp_path / "art", "--text", tmp_path / "c.txt")
    assert code == EXIT_USAGE and "--tokenizer HUB_DIR and --seq-len N" in err, err
