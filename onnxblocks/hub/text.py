"""Text as batches of a causal language model: tokenized, packed into fixed-length windows.

:class:`TextBatches` reads a text (a string or a file), tokenizes it with the hub folder's
``tokenizer.json`` (the ``tokenizers`` package: ``pip install "onnxblocks[hub]"``), joins the
documents (lines, or blank-line separated paragraphs) with the end-of-sequence token and cuts the
stream into windows of ``seq_len`` tokens. Each batch is a dict keyed by input name, as
:func:`onnxblocks.runtime.fit` and the session's steps take it: ``input_ids``, ``attention_mask``,
``position_ids``, ``labels`` (the input ids; the loss shifts them), and for a with-past export an
empty cache (past length 0) for each past key-value input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks._core.errors import FileMissingError, InvalidValueError, MissingDependencyError
from onnxblocks._core.hyperparams import count
from onnxblocks._core.weights import load_structure
from onnxblocks.hub.record import has_record, read_record


def load_tokenizer(hub_dir: str | os.PathLike) -> Any:
    """The ``tokenizers.Tokenizer`` of ``hub_dir/tokenizer.json``.

    Raises:
        MissingDependencyError: without the ``tokenizers`` package (says how to install it).
        FileMissingError: when the folder has no ``tokenizer.json``.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingDependencyError(
            "Tokenizing text needs the 'tokenizers' package: pip install \"onnxblocks[hub]\"."
        ) from None
    path = Path(hub_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileMissingError(
            f"{str(hub_dir)!r} has no tokenizer.json; pass the hub folder the model came from "
            "(Transformers.js folders keep tokenizer.json beside config.json)."
        )
    return Tokenizer.from_file(os.fspath(path))


def _eos(hub_dir: Path) -> int | None:
    path = hub_dir / "config.json"
    if not path.is_file():
        return None
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) and not isinstance(eos, bool) else None


def empty_past(artifacts: str | os.PathLike | None, batch: int) -> dict[str, np.ndarray]:
    """An empty cache (past length 0) for each past input of a with-past artifact set, by name.

    ``{}`` for a set without past inputs or without ``hub.json``. Each array is
    ``[batch, heads, 0, head_dim]`` float32, shaped from the hub file's declared inputs.

    Raises:
        InvalidValueError: for a past input without fixed heads and head size.
    """
    if artifacts is None or not has_record(artifacts):
        return {}
    record = read_record(artifacts)
    if not record.past_inputs:
        return {}
    graph = load_structure(record.check_source() / record.file).graph
    out = {}
    for value in graph.input:
        if value.name in record.past_inputs:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in
                    value.type.tensor_type.shape.dim]  # fmt: skip
            if len(dims) != 4 or dims[1] is None or dims[3] is None:
                raise InvalidValueError(
                    f"TextBatches: past input {value.name!r} of {record.file!r} has shape {dims}; "
                    "expected [batch, heads, past_length, head_dim] with fixed heads and head_dim."
                )
            out[value.name] = np.zeros((batch, dims[1], 0, dims[3]), np.float32)
    return out


def _read_text(text: str | os.PathLike) -> str:
    """``text`` itself, or the file it names (a path object, or a short one-line existing path)."""
    if isinstance(text, os.PathLike):
        return Path(text).read_text(encoding="utf-8")
    one_line = "\n" not in text and len(text) < 4096
    return Path(text).read_text(encoding="utf-8") if one_line and Path(text).is_file() else text


class TextBatches:
    """Batches of packed token windows for a causal language model, re-iterable (one per epoch).

    Args:
        text: The text, or the path of a UTF-8 text file.
        tokenizer: The hub folder with ``tokenizer.json`` (and ``config.json``'s
            ``eos_token_id``, put between documents), or a ``tokenizers.Tokenizer``.
        seq_len: Tokens per window.
        batch_size: Windows per batch; the last batch may have fewer.
        artifacts: An artifact directory made by :func:`~onnxblocks.hub.from_hub`: with a
            with-past export, each batch also holds an empty cache for every past input.
        shuffle: Shuffle the windows each epoch (``seed``, then ``seed + 1``...).
        seed: The first epoch's shuffling seed.

    Raises:
        InvalidValueError: for a ``seq_len`` or ``batch_size`` below 1, or a text shorter than one
            window (the message gives its token count).
    """

    def __init__(
        self,
        text: str | os.PathLike,
        tokenizer: Any,
        seq_len: int,
        batch_size: int = 8,
        *,
        artifacts: str | os.PathLike | None = None,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
            count(value, f"TextBatches: {name}", 1)
        text = _read_text(text)
        eos = None
        if isinstance(tokenizer, (str, os.PathLike)):
            eos = _eos(Path(tokenizer))
            tokenizer = load_tokenizer(tokenizer)
        documents = [d for d in str(text).split("\n\n") if d.strip()] or [str(text)]
        ids: list[int] = []
        for encoding in tokenizer.encode_batch(documents):
            ids.extend(encoding.ids)
            if eos is not None:
                ids.append(eos)
        windows = len(ids) // seq_len
        if windows == 0:
            raise InvalidValueError(
                f"TextBatches: the text has {len(ids)} tokens, fewer than one window of "
                f"seq_len={seq_len}; pass more text or a smaller seq_len."
            )
        self.tokens = np.asarray(ids[: windows * seq_len], np.int64).reshape(windows, seq_len)
        self.seq_len, self.batch_size = seq_len, batch_size
        self.shuffle, self.seed, self._epoch = shuffle, seed, 0
        self._artifacts = artifacts

    @property
    def epoch(self) -> int:
        """Epochs iterated so far."""
        return self._epoch

    def __len__(self) -> int:
        return -(-len(self.tokens) // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        order = np.arange(len(self.tokens))
        if self.shuffle:
            np.random.default_rng(self.seed + self._epoch).shuffle(order)
        self._epoch += 1
        for start in range(0, len(order), self.batch_size):
            ids = self.tokens[order[start : start + self.batch_size]]
            rows = len(ids)
            yield {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "position_ids": np.tile(np.arange(self.seq_len, dtype=np.int64), (rows, 1)),
                "labels": ids.copy(),
                **empty_past(self._artifacts, rows),
            }

    def __repr__(self) -> str:
        return (
            f"TextBatches({len(self.tokens)} windows of {self.seq_len} tokens, "
            f"batch_size={self.batch_size})"
        )
