"""Checkpoint guards: checkpoints checked against their model, and saves that leave one complete checkpoint.

Each test is one bad input or environment, asserting the exact behaviour: the exception type, the offender
it names, the values read back by onnxblocks and ONNX Runtime, and the directory before and after. Corruption
fuzzing and killed saves, which need separate processes, are in ``test_crash_and_corruption.py``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from support.runtime_support import classification_data, generate, listing, mlp_model, tensors

from onnxblocks._core.ort import capi
from onnxblocks.checkpoint import (
    check_checkpoint,
    load_checkpoint,
    load_checkpoint_to_model,
    read_parameter_names,
    save_checkpoint,
)
from onnxblocks.checkpoint._generated import ort_training_checkpoint_generated as fbs
from onnxblocks.cli import EXIT_INPUT, main
from onnxblocks.errors import CheckpointFormatError, CheckpointMismatchError
from onnxblocks.runtime import TrainingSession


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """MLP classifier artifacts (2 -> 16 -> 3, fused cross entropy, AdamW)."""
    return generate(tmp_path_factory.mktemp("art"))


@pytest.fixture(scope="module")
def other_shapes(tmp_path_factory):
    """A checkpoint with the same parameter names as ``art`` but a hidden size of 4."""
    return generate(tmp_path_factory.mktemp("other"), model=mlp_model(hidden=4)) / "checkpoint"


@pytest.fixture(scope="module")
def trained(art, tmp_path_factory):
    """A checkpoint the training session saved after one step (optimizer state and properties included)."""
    session = TrainingSession(art)
    session.train_step(*classification_data())
    session.optimizer_step()
    return session.save_checkpoint(
        tmp_path_factory.mktemp("trained") / "ckpt", properties={"epoch": 1}
    )


# =========================================================================== checkpoints against the model
def test_same_names_other_shapes_is_refused_before_ort(art, other_shapes):
    with pytest.raises(CheckpointMismatchError) as info:
        TrainingSession(art, checkpoint=other_shapes)
    message = str(info.value)
    for fragment in (
        str(other_shapes),
        "'fc1.weight'",
        "[2, 4]",
        "float32 [2, 16]",
        "same names but other shapes",
    ):
        assert fragment in message, message
    assert "pass a checkpoint saved from these artifacts" in message
    session = TrainingSession(art)
    before = session.get_parameter("fc1.weight")
    with pytest.raises(CheckpointMismatchError, match="'fc1.weight' has shape \\[2, 4\\]"):
        session.load_checkpoint(other_shapes)
    np.testing.assert_array_equal(
        session.get_parameter("fc1.weight"), before
    )  # the session is untouched
    with pytest.raises(CheckpointMismatchError):
        check_checkpoint(other_shapes, art / "training_model.onnx")
    check_checkpoint(other_shapes)  # on its own, the file is fine


def test_foreign_checkpoint_is_not_a_checkpoint_of_this_model(art, tmp_path):
    save_checkpoint(
        (tensors({"conv.weight": np.zeros((3, 3), np.float32)}), []), tmp_path / "foreign"
    )
    with pytest.raises(
        CheckpointMismatchError, match="is not a checkpoint of the model 'training_model.onnx'"
    ) as e:
        TrainingSession(art, checkpoint=tmp_path / "foreign")
    assert "['conv.weight']" in str(e.value) and "'fc1.weight'" in str(e.value)


def test_checkpoint_with_a_trained_parameter_frozen_is_refused(art, tmp_path):
    ck = load_checkpoint(art / "checkpoint")
    trainable = {k: v for k, v in ck.trainable.items() if k != "fc2.bias"}
    save_checkpoint(
        (tensors(trainable), tensors({"fc2.bias": ck["fc2.bias"]})), tmp_path / "frozen"
    )
    with pytest.raises(
        CheckpointMismatchError, match=r"trains \[.*\]: \['fc2.bias'\] are frozen in it"
    ):
        TrainingSession(art, checkpoint=tmp_path / "frozen")


def _group_without_name(trained: Path, target: Path) -> Path:
    """``trained`` with one byte changed: its optimizer group's vtable entry for ``group_name`` set to 0 (absent)."""
    data = bytearray(trained.read_bytes())
    root = fbs.Checkpoint.GetRootAs(bytes(data), 0)
    group = root.OptimizerGroups(0)
    table = group._tab.Pos
    vtable = table - int.from_bytes(data[table : table + 4], "little", signed=True)
    assert (
        data[vtable + 5] == 0 and data[vtable + 4] != 0
    )  # group_name is the first field: its voffset's low byte
    data[vtable + 4] = 0
    target.write_bytes(bytes(data))
    return target


def test_a_one_byte_corruption_that_crashes_onnx_runtime_is_refused_everywhere(
    art, trained, tmp_path, capsys
):
    broken = _group_without_name(trained, tmp_path / "broken")
    # The hazard is real: ONNX Runtime itself dereferences the missing name (SIGSEGV).
    code = f"from onnxblocks._core.ort import capi; capi().load_checkpoint({str(broken)!r})"
    crashed = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert crashed.returncode < 0 or crashed.returncode > 128, crashed
    for call in (load_checkpoint, read_parameter_names, check_checkpoint):
        with pytest.raises(CheckpointFormatError, match="group name is missing"):
            call(broken)
    with pytest.raises(
        CheckpointFormatError, match=f"checkpoint '{broken}' > optimizer_groups\\[0\\]"
    ):
        TrainingSession(art, checkpoint=broken)
    # the CLI: exit 3 with one line, not 139
    (tmp_path / "d.npz").write_bytes(b"")
    x, y = classification_data()
    np.savez(tmp_path / "d.npz", x=x, labels=y)
    assert (
        main(["train", str(art), "--data", str(tmp_path / "d.npz"), "--resume", str(broken)])
        == EXIT_INPUT
    )
    err = capsys.readouterr().err
    assert (
        err.startswith("onnxblocks: error: ")
        and "group name is missing" in err
        and err.count("\n") == 1
    )


def test_the_display_checks_the_checkpoint_against_the_training_model(art, other_shapes, tmp_path):
    from onnxblocks.display.training import render_artifacts_dir

    copy = tmp_path / "art"
    copy.mkdir()
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        (copy / name).write_bytes((art / name).read_bytes())
    (copy / "checkpoint").write_bytes(other_shapes.read_bytes())
    html = render_artifacts_dir(copy)._repr_html_()
    assert "belongs to another model" in html
    (copy / "checkpoint").write_bytes((art / "checkpoint").read_bytes())
    assert "belongs to another model" not in render_artifacts_dir(copy)._repr_html_()


def test_fifo_checkpoint_is_refused_without_blocking(art, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointFormatError, match="FIFO"):
        TrainingSession(art, checkpoint=fifo)
    with pytest.raises(CheckpointFormatError, match="FIFO"):
        check_checkpoint(fifo)


def test_foreign_bytes_and_non_utf8_names_are_format_errors(art, tmp_path):
    (tmp_path / "random").write_bytes(np.random.default_rng(0).bytes(512))
    with pytest.raises(CheckpointFormatError, match="not an ONNX Runtime training checkpoint"):
        TrainingSession(art, checkpoint=tmp_path / "random")
    save_checkpoint(
        (tensors({"fc1.wei\u00e9ght": np.zeros(2, np.float32)}), []), tmp_path / "latin"
    )
    data = (tmp_path / "latin").read_bytes().replace("\u00e9".encode(), b"\xff\xfe")
    (tmp_path / "latin").write_bytes(data)
    with pytest.raises(CheckpointFormatError, match="is not UTF-8 text"):
        TrainingSession(art, checkpoint=tmp_path / "latin")


def test_load_checkpoint_to_model_refuses_a_checkpoint_matching_nothing(tmp_path):
    model = mlp_model()
    before = model.SerializeToString()
    save_checkpoint((tensors({"encoder.w": np.zeros(3, np.float32)}), []), tmp_path / "ck")
    with pytest.raises(
        ValueError, match="is not a checkpoint of this model: none of its parameters"
    ) as info:
        load_checkpoint_to_model(tmp_path / "ck", model)
    assert "['encoder.w']" in str(info.value) and "'fc1.weight'" in str(info.value)
    assert model.SerializeToString() == before


def test_load_checkpoint_to_model_partial_match_warns_or_refuses(tmp_path):
    model = mlp_model()
    values = {"fc1.weight": np.full((2, 16), 3, np.float32), "loss.scale": np.ones(1, np.float32)}
    save_checkpoint((tensors(values), []), tmp_path / "ck")
    with pytest.warns(UserWarning, match=r"\['loss.scale'\] are not initializers of the model"):
        loaded = load_checkpoint_to_model(tmp_path / "ck", model)
    inits = {i.name: numpy_helper.to_array(i) for i in loaded.graph.initializer}
    np.testing.assert_array_equal(inits["fc1.weight"], values["fc1.weight"])
    np.testing.assert_array_equal(
        inits["fc2.bias"], numpy_helper.to_array(model.graph.initializer[3])
    )
    with pytest.raises(ValueError, match=r"parameters \['loss.scale'\]"):
        load_checkpoint_to_model(tmp_path / "ck", model, strict=True)


def test_load_checkpoint_to_a_training_model_says_to_pass_the_inference_model(art):
    training = onnx.load(art / "training_model.onnx")
    with pytest.raises(ValueError, match="takes .* as graph inputs .*pass the inference model"):
        load_checkpoint_to_model(art / "checkpoint", training)


# =========================================================================== saving: the pair, temp files, umask
def _values(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((64,), v, np.float32), "b": np.full((16,), v, np.float32)}


def _ort_values(path: Path) -> dict[str, np.ndarray]:
    state = capi().load_checkpoint(os.fspath(path))  # (kept alive while its parameters are read)
    return {
        n: np.array(state.get_parameter(n).data.numpy(), copy=True) for n in state.parameter_names()
    }


def test_replacing_an_external_checkpoint_swaps_header_and_data_at_once(tmp_path):
    for value in (1, 2, 3):
        save_checkpoint((tensors(_values(value)), []), tmp_path / "ck", external_data_threshold=0)
        for reader in (lambda p: dict(load_checkpoint(p).trainable), _ort_values):
            got = reader(tmp_path / "ck")
            assert set(got) == {"w", "b"} and all((a == value).all() for a in got.values())
    # after the second save: both names are links through one `current` link, swapped by one rename
    assert os.readlink(tmp_path / "ck") == os.path.join(".ck.versions", "current", "ck")
    assert os.readlink(tmp_path / "ck.data") == os.path.join(".ck.versions", "current", "ck.data")
    versions = sorted(os.listdir(tmp_path / ".ck.versions"))
    assert len(versions) == 2 and "current" in versions  # the old version is gone
    save_checkpoint((tensors(_values(4)), []), tmp_path / "ck")  # inline again: one plain file
    assert listing(tmp_path) == ["ck"] and not (tmp_path / "ck").is_symlink()
    assert (load_checkpoint(tmp_path / "ck")["w"] == 4).all()


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def test_temp_files_of_killed_saves_are_removed_by_the_next_save(art, tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    stale = [
        f".ck.{dead}-0123456789ab.tmp",
        f".ck.{dead}-0123456789ab.tmp.data",
        f".model.onnx.{dead}-ba9876543210.tmp",
    ]
    keep = [
        f".ck.{alive}-00000000000a.tmp",
        ".ck.12345.tmp",
        "notes.txt",
    ]  # a live writer's, not ours, the user's
    for name in stale + keep:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / f".ck.versions.{dead}-0123456789ac.tmp").mkdir()
    save_checkpoint((tensors(_values(1)), []), tmp_path / "ck")
    assert listing(tmp_path) == sorted(["ck", *keep])
    for name in stale:
        (tmp_path / name).write_bytes(b"x")
    TrainingSession(art).save_checkpoint(tmp_path / "ck")  # the session's saves clean up too
    assert listing(tmp_path) == sorted(["ck", *keep])


def _created_with_umask(mask: int, action) -> None:
    old = os.umask(mask)
    try:
        action()
    finally:
        os.umask(old)


def test_checkpoint_files_and_directories_follow_the_umask(art, tmp_path):
    def save_all() -> None:
        save_checkpoint((tensors(_values(1)), []), tmp_path / "ck", external_data_threshold=0)
        save_checkpoint(
            (tensors(_values(2)), []), tmp_path / "ck", external_data_threshold=0
        )  # versioned
        TrainingSession(art).save_checkpoint(tmp_path / "new" / "session_ck")

    _created_with_umask(0o027, save_all)
    modes = {
        p: stat.S_IMODE(os.stat(tmp_path / p).st_mode)
        for p in listing(tmp_path)
        if "current" not in p
    }
    for path, mode in modes.items():
        is_dir = (tmp_path / path).is_dir()
        assert mode == (0o750 if is_dir else 0o640), (path, oct(mode))


def test_save_errors_name_the_checkpoint_not_its_temporary_files(art, tmp_path, monkeypatch):
    import errno

    from onnxblocks.checkpoint import save as save_module

    def full_disk(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(save_module, "open", full_disk, raising=False)
    with pytest.raises(OSError, match="No space left on device") as info:
        save_checkpoint((tensors(_values(1)), []), tmp_path / "ck", external_data_threshold=0)
    assert info.value.filename == str(tmp_path / "ck.data") and ".tmp" not in str(info.value)
    monkeypatch.undo()
    session = TrainingSession(art)

    def failing_save(
        path, include_optimizer_state
    ):  # what ONNX Runtime raises when it cannot write
        raise capi().Fail(
            f"/onnxruntime_src/orttraining/checkpoint.cc:42 onnxruntime::common::Status onnxruntime::Save(const "
            f"std::string&) Failed to save checkpoint to file: {path}"
        )

    monkeypatch.setattr(session._backend, "save", failing_save)
    with pytest.raises(capi().Fail) as failed:
        session.save_checkpoint(tmp_path / "ck")
    assert (
        str(failed.value) == f"Failed to save checkpoint to file: {tmp_path / 'ck'}"
    )  # no C++, no temp name
    assert listing(tmp_path) == []
