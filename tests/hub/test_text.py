"""``hub.TextBatches``: text tokenized with the hub folder's tokenizer, packed into fixed windows, fed to ``fit``."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.optimum_env import optimum_export

from onnxblocks.errors import FileMissingError, InvalidValueError
from onnxblocks.hub import TextBatches, empty_past, from_hub, load_tokenizer
from onnxblocks.runtime import TrainingSession, fit

TEXT = "the cat sat on the mat\n\nthe dog ran to the cat and it was\n\nshe ran in the mat " * 6


@pytest.fixture(scope="module")
def hub():
    return optimum_export("llama", with_past=True)


def test_windows_are_the_documents_tokens_joined_by_eos(hub):
    eos = json.loads((hub / "config.json").read_text())["eos_token_id"]
    tokenizer = load_tokenizer(hub)
    documents = [d for d in TEXT.split("\n\n") if d.strip()]
    stream = [i for d in documents for i in [*tokenizer.encode(d).ids, eos]]
    batches = TextBatches(TEXT, hub, seq_len=8, batch_size=3)
    windows = len(stream) // 8
    np.testing.assert_array_equal(batches.tokens.ravel(), stream[: windows * 8])
    assert len(batches) == -(-windows // 3)
    first = next(iter(batches))
    np.testing.assert_array_equal(first["labels"], first["input_ids"])
    np.testing.assert_array_equal(first["position_ids"][1], np.arange(8))
    assert not any(k.startswith("past_key_values") for k in first)


def test_fit_trains_a_with_past_export_on_text_with_an_empty_cache(hub, tmp_path):
    from_hub(hub, tmp_path / "art")
    batches = TextBatches(TEXT, hub, seq_len=8, batch_size=4, artifacts=tmp_path / "art")
    first = next(iter(batches))
    assert first["past_key_values.0.key"].shape == (4, 2, 0, 8)
    assert sorted(empty_past(tmp_path / "art", 3)) == [
        f"past_key_values.{i}.{kv}" for i in (0, 1) for kv in ("key", "value")
    ]
    session = TrainingSession(tmp_path / "art")
    session.learning_rate = 0.01
    history = fit(session, batches, epochs=3, progress=False)
    losses = history.metric("loss")
    assert losses[-1] < losses[0], losses


def test_bad_text_and_tokenizer_say_what_to_do(hub, tmp_path):
    with pytest.raises(InvalidValueError, match="fewer than one window"):
        TextBatches("the cat", hub, seq_len=64)
    with pytest.raises(InvalidValueError, match="seq_len must be an int >= 1"):
        TextBatches(TEXT, hub, seq_len=0)
    bare = tmp_path / "bare"
    shutil.copytree(hub, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(FileMissingError, match="no tokenizer.json"):
        TextBatches(TEXT, bare, seq_len=8)
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    assert len(TextBatches(path, hub, seq_len=8).tokens) == len(
        TextBatches(TEXT, hub, seq_len=8).tokens
    )
