"""Opening a session reads each artifact file once and checks the set once (ArtifactSet).

File reads are counted with an audit hook on ``open`` (Python's own opens: ``open``,
``os.open``, ``Path.open``, numpy's memory maps), so every reader in the package is
seen whatever function it goes through. ONNX Runtime opens the model files again by
path, in C++; those opens are not Python's and are not counted.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.runtime_support import PARAMS, mlp_model

from onnxblocks import artifacts, optim
from onnxblocks.runtime import TrainingSession
from onnxblocks.runtime import artifact_set as artifact_set_module

_counting: list[Counter] = []


def _hook(event: str, args: tuple) -> None:
    if _counting and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _counting[-1][Path(os.fsdecode(args[0])).resolve()] += 1


sys.addaudithook(_hook)


@contextmanager
def counted_opens() -> Iterator[Counter]:
    counts: Counter = Counter()
    _counting.append(counts)
    try:
        yield counts
    finally:
        _counting.pop()


def _reads(counts: Counter, directory: Path) -> dict[str, int]:
    """Opens of the files of ``directory``, by name (every file listed, 0 when unread)."""
    root = directory.resolve()
    files = {p.name: 0 for p in root.iterdir() if p.is_file()}
    for path, n in counts.items():
        if path.parent == root:
            files[path.name] = files.get(path.name, 0) + n
    return files


@pytest.fixture(scope="module", params=["training", "portable"])
def art(request, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp(request.param)
    artifacts.generate_artifacts(
        mlp_model(),
        requires_grad=PARAMS,
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=optim.AdamW(),
        artifact_directory=directory,
        additional_output_names=["logits"],
        portable=request.param == "portable",
    )
    TrainingSession(directory)  # modules imported on first use are not the artifacts' reads
    return directory


def test_opening_a_session_reads_each_artifact_file_once(art):
    with counted_opens() as counts:
        session = TrainingSession(art)
    reads = _reads(counts, art)
    expected = {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"}
    if session.backend == "portable":
        expected.add("step_model.onnx")
    assert expected <= set(reads)
    assert reads == dict.fromkeys(reads, 1), reads


def test_loading_a_checkpoint_reads_the_checkpoint_only(art, tmp_path):
    session = TrainingSession(art)
    saved = session.save_checkpoint(tmp_path / "ck")
    with counted_opens() as counts:
        session.load_checkpoint(saved)
    assert _reads(counts, art) == dict.fromkeys(_reads(counts, art), 0)
    assert _reads(counts, tmp_path) == {"ck": 1}


def test_the_set_is_checked_once_per_checkpoint(art, tmp_path, monkeypatch):
    calls: Counter = Counter()
    for name in ("check_artifact_set", "read_checked"):
        real = getattr(artifact_set_module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(artifact_set_module, name, counted)
    session = TrainingSession(art)
    assert calls == {"check_artifact_set": 1, "read_checked": 1}
    session.load_checkpoint(session.save_checkpoint(tmp_path / "ck"))
    assert calls == {"check_artifact_set": 2, "read_checked": 2}
