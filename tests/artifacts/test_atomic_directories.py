"""Artifact directories are replaced atomically: a directory holds the old complete set or the new complete set.

Each test lists the directory before and after. The kill tests run ``generate_artifacts`` in a
subprocess and SIGKILL it: at random moments, and deterministically at each file move of the commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import onnx
import pytest
from support.onnx_models import make_linear_model

from onnxblocks import LossType, OptimType, generate_artifacts
from onnxblocks.artifacts import files
from onnxblocks.artifacts import lock as artifact_lock
from onnxblocks.checkpoint import load_checkpoint

OLD = {"requires_grad": ["W"], "loss": LossType.MSELoss}
NEW = {
    "requires_grad": ["W", "b"],
    "loss": LossType.L1Loss,
    "optimizer": OptimType.AdamW,
    "nominal_checkpoint": True,
}


def _generate(directory, config, **kwargs):
    return generate_artifacts(make_linear_model(), artifact_directory=directory, **config, **kwargs)


def _contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def reference_sets(tmp_path_factory):
    """The bytes of the old and the new set (generation is deterministic)."""
    old, new = tmp_path_factory.mktemp("old"), tmp_path_factory.mktemp("new")
    _generate(old, OLD)
    _generate(new, NEW)
    return _contents(old), _contents(new)


def _strays(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".onnxblocks-artifacts"))


# ------------------------------------------------------------------ prefixes
def test_empty_prefix_keeps_another_prefixes_checkpoint(tmp_path):
    _generate(tmp_path, OLD, prefix="nominal_")
    other = _contents(tmp_path)
    assert sorted(other) == [
        "nominal_checkpoint",
        "nominal_eval_model.onnx",
        "nominal_training_model.onnx",
    ]
    _generate(tmp_path, OLD, prefix="")
    _generate(tmp_path, OLD, prefix="")  # a second run removes stale files of its own set only
    after = _contents(tmp_path)
    assert {n: after[n] for n in other} == other  # "nominal_checkpoint" is the other set's: kept
    assert sorted(after) == sorted([*other, "checkpoint", "eval_model.onnx", "training_model.onnx"])


def test_empty_prefix_refuses_to_overwrite_another_prefixes_file(tmp_path):
    _generate(tmp_path, OLD, prefix="nominal_")
    _generate(tmp_path, OLD, prefix="")
    before = _contents(tmp_path)
    with pytest.raises(
        FileExistsError,
        match=r"'.*nominal_checkpoint' for the artifacts with prefix ''.*prefix 'nominal_'",
    ):
        _generate(tmp_path, OLD, prefix="", nominal_checkpoint=True)
    assert _contents(tmp_path) == before and _strays(tmp_path) == []


def test_stale_files_of_the_same_prefix_are_removed_and_others_kept(tmp_path):
    _generate(tmp_path, NEW, prefix="", ort_format=True)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "other_checkpoint").write_text("another prefix's")
    _generate(tmp_path, OLD, prefix="")
    assert sorted(_contents(tmp_path)) == [
        "checkpoint",
        "eval_model.onnx",
        "notes.txt",
        "other_checkpoint",
        "training_model.onnx",
    ]


# ------------------------------------------------------------------ all or nothing
def test_stray_directory_in_place_of_an_artifact_changes_nothing(tmp_path, reference_sets):
    old, _ = reference_sets
    _generate(tmp_path, OLD)
    (tmp_path / "optimizer_model.onnx").mkdir()
    with pytest.raises(
        IsADirectoryError, match=r"'.*optimizer_model.onnx': it is a directory.*Nothing was changed"
    ):
        _generate(tmp_path, NEW)
    assert _contents(tmp_path) == old and (tmp_path / "optimizer_model.onnx").is_dir()
    assert _strays(tmp_path) == []


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError])
@pytest.mark.parametrize("at", [1, 3, 6, 9])
def test_interrupt_between_moves_rolls_back_to_the_old_set(
    tmp_path, reference_sets, monkeypatch, interrupt, at
):
    old, new = reference_sets
    _generate(tmp_path, OLD)
    calls = []
    real = os.replace

    def replace(src, dst):
        if (
            Path(src).parent.name.startswith(".onnxblocks-artifacts")
            or Path(dst).parent.name == ".old"
        ):
            calls.append(dst)
            if len(calls) == at:
                raise interrupt("interrupted between moves")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(interrupt, match="interrupted between moves"):
        _generate(tmp_path, NEW)
    assert _contents(tmp_path) == old and _strays(tmp_path) == []
    monkeypatch.setattr(files.os, "replace", real)
    _generate(tmp_path, NEW)
    assert _contents(tmp_path) == new


def test_rollback_cut_short_is_finished_by_the_next_run(tmp_path, reference_sets, monkeypatch):
    """A second interrupt during the rollback leaves the journal and the old files; the next run puts them back."""
    old, new = reference_sets
    _generate(tmp_path, OLD)
    calls = []
    real = os.replace

    def replace(src, dst):
        if (
            Path(dst).parent.name == ".old"
            or Path(src).parent.name == ".old"
            or Path(dst).parent == tmp_path
        ):
            calls.append((src, dst))
            if len(calls) == 5:  # the second new file moved in: the commit fails
                raise OSError("disk on fire")
            if len(calls) == 6:  # the first step of the rollback: interrupted too
                raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _generate(tmp_path, NEW)
    monkeypatch.setattr(files.os, "replace", real)
    (stage,) = [tmp_path / n for n in _strays(tmp_path)]
    assert (stage / ".journal").exists() and any(
        (stage / ".old").iterdir()
    )  # the old files are kept
    assert _contents(tmp_path) not in (
        old,
        new,
    )  # mixed until the next run (or recover) puts the old files back
    assert files.recover(tmp_path) == [stage] and _contents(tmp_path) == old
    _generate(tmp_path, NEW)
    assert _contents(tmp_path) == new and _strays(tmp_path) == []


def test_new_files_and_directories_follow_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        _generate(tmp_path / "a" / "b", NEW)
    finally:
        os.umask(previous)
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):
        assert directory.stat().st_mode & 0o777 == 0o750
    for path in (tmp_path / "a" / "b").iterdir():
        assert path.stat().st_mode & 0o777 == 0o640, path.name


# ------------------------------------------------------------------ concurrency
def test_concurrent_writers_all_succeed_with_one_complete_set_per_prefix(tmp_path, reference_sets):
    _, new = reference_sets
    errors: list[BaseException] = []

    def write(prefix: str) -> None:
        try:
            _generate(tmp_path, NEW, prefix=prefix)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in ["", "a_", "b_"] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = _contents(tmp_path)
    for prefix in ("", "a_", "b_"):
        assert {
            n[len(prefix) :]: got[n]
            for n in got
            if n.startswith(prefix) and n[len(prefix) :] in new
        } == new
    assert len(got) == 3 * len(new) and _strays(tmp_path) == []


def test_second_writer_waits_for_the_lock_then_times_out_clearly(
    tmp_path, reference_sets, monkeypatch
):
    _, new = reference_sets
    tmp_path.mkdir(exist_ok=True)
    released = threading.Event()

    def hold(seconds: float) -> None:
        with artifact_lock.directory_lock(tmp_path):
            started.set()
            time.sleep(seconds)
        released.set()

    started = threading.Event()
    holder = threading.Thread(target=hold, args=(0.5,))
    holder.start()
    started.wait()
    _generate(tmp_path, NEW)  # waits for the holder
    assert released.is_set() and _contents(tmp_path) == new
    holder.join()

    monkeypatch.setattr(artifact_lock, "DEFAULT_TIMEOUT_S", 0.2)
    started.clear()
    holder = threading.Thread(target=hold, args=(1.0,))
    holder.start()
    started.wait()
    with pytest.raises(
        TimeoutError,
        match=r"Another generate_artifacts call has been writing into '.*' for more than 0.2 s",
    ):
        _generate(tmp_path, OLD)
    holder.join()
    assert _contents(tmp_path) == new and _strays(tmp_path) == []


# ------------------------------------------------------------------ killed writers
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_staging_directories_of_dead_processes_are_recovered(tmp_path, reference_sets):
    old, new = reference_sets
    _generate(tmp_path, OLD)
    dead = _dead_pid()
    junk = tmp_path / f".onnxblocks-artifacts-{dead}-0123456789ab"
    junk.mkdir()
    (junk / "training_model.onnx").write_bytes(b"x" * 1000)
    # a commit killed half way: checkpoint already moved in, training model moved aside
    half = tmp_path / f".onnxblocks-artifacts-{dead}-abcdef012345"
    (half / ".old").mkdir(parents=True)
    os.replace(tmp_path / "checkpoint", half / ".old" / "checkpoint")
    os.replace(tmp_path / "training_model.onnx", half / ".old" / "training_model.onnx")
    (tmp_path / "checkpoint").write_bytes(b"new checkpoint")
    (half / "training_model.onnx").write_bytes(b"new model, not moved yet")
    journal = {
        "new": ["checkpoint", "training_model.onnx"],
        "old": ["checkpoint", "training_model.onnx"],
    }
    (half / ".journal").write_text(json.dumps(journal))
    alive = (
        tmp_path / f".onnxblocks-artifacts-{os.getppid()}-fedcba987654"
    )  # a live writer's: left alone
    alive.mkdir()
    assert sorted(p.name for p in files.recover(tmp_path)) == sorted([junk.name, half.name])
    assert _contents(tmp_path) == old  # the half-done commit is rolled back
    assert _strays(tmp_path) == [alive.name]
    alive.rmdir()
    _generate(tmp_path, NEW)
    assert _contents(tmp_path) == new and _strays(tmp_path) == []


_KILLED_WRITER = """
import os, signal, sys
import onnxblocks
from onnxblocks.artifacts import files
kill_at = int(sys.argv[1])
if kill_at:
    real, calls = os.replace, []
    def replace(src, dst):
        calls.append(dst)
        if len(calls) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)
    files.os.replace = replace  # the commit's moves only
print("ready", flush=True)
onnxblocks.generate_artifacts(sys.argv[3], artifact_directory=sys.argv[2],
    requires_grad=["W", "b"], loss=onnxblocks.LossType.L1Loss, optimizer=onnxblocks.OptimType.AdamW,
    nominal_checkpoint=True)
"""


def _writer(directory: Path, kill_at: int = 0) -> subprocess.Popen:
    model = directory.parent / f"{directory.name}-model.onnx"
    if not model.exists():
        onnx.save(make_linear_model(), model)
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_KILLED_WRITER),
            str(kill_at),
            str(directory),
            str(model),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _check_after_kill(directory: Path, old: dict, new: dict) -> str:
    """After a kill: old or new set; a commit cut short is rolled back by the next writer (here: recover)."""
    got = _contents(directory)
    got.pop(artifact_lock.LOCK_NAME, None)  # a killed writer's lock file is reused, then removed
    if got not in (old, new):
        assert any(
            (p / ".journal").exists()
            for p in directory.iterdir()
            if p.name.startswith(".onnxblocks-artifacts-")
        )
        files.recover(directory)
        got = _contents(directory)
    assert got in (old, new)
    return "old" if got == old else "new"


# the moves of one run (os.replace): 1-5 the staged files, 6 the journal, 7-9 the old files aside, 10-14 the new
# ones in, 15: none left (it completes); one kill in each phase, and at each end of the commit
@pytest.mark.parametrize("kill_at", [1, 6, 7, 9, 10, 12, 14, 15])
def test_writer_killed_at_each_move_of_the_commit_leaves_a_complete_set(
    tmp_path, reference_sets, kill_at
):
    old, new = reference_sets
    _generate(tmp_path, OLD)
    writer = _writer(tmp_path, kill_at)
    writer.wait(timeout=120)
    if writer.returncode == 0:  # fewer moves than kill_at: the commit completed
        assert _contents(tmp_path) == new
        return
    assert writer.returncode == -signal.SIGKILL, writer.stderr.read().decode()[-2000:]
    _check_after_kill(tmp_path, old, new)
    _generate(tmp_path, NEW)  # the next run
    assert _contents(tmp_path) == new and _strays(tmp_path) == []


def test_writer_killed_at_random_moments(tmp_path, reference_sets):
    old, new = reference_sets
    rng = random.Random(12)
    outcomes = []
    for _ in range(4):
        _generate(tmp_path, OLD)
        writer = _writer(tmp_path)
        assert (
            writer.stdout.readline().strip() == b"ready"
        )  # imports done: the kill lands in generate_artifacts
        time.sleep(rng.uniform(0.0, 0.4))
        with contextlib.suppress(ProcessLookupError):
            writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=120)
        outcomes.append(_check_after_kill(tmp_path, old, new))
        _generate(tmp_path, OLD)  # the next run cleans what the killed one left
        assert _contents(tmp_path) == old and _strays(tmp_path) == []
    assert set(outcomes) <= {"old", "new"}


def test_checkpoint_of_a_committed_set_matches_its_models(tmp_path):
    art = _generate(tmp_path, NEW)
    assert list(load_checkpoint(art.checkpoint).trainable) == ["W", "b"]
