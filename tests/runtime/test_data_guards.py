"""Guards on the data a user hands in: checkpoints against their model, external data, runtime calls, the CLI.

Each test is one bad input or environment, asserting the exact behaviour: the exception type, the offender it names,
the numbers (against torch), and the directory before and after. The tests that need separate processes
(corruption fuzzing, kills) are in ``tests/checkpoint/test_crash_and_corruption.py``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.runtime_support import PARAMS, classification_data, generate, mlp_model

from onnxblocks import losses
from onnxblocks._core.ort import capi
from onnxblocks.checkpoint import (
    check_checkpoint,
    load_checkpoint,
    load_checkpoint_to_model,
    read_parameter_names,
    save_checkpoint,
)
from onnxblocks.checkpoint._generated import ort_training_checkpoint_generated as fbs
from onnxblocks.cli import EXIT_INPUT, EXIT_OK, EXIT_USAGE, main
from onnxblocks.errors import CheckpointFormatError, CheckpointMismatchError
from onnxblocks.io import load_model, save_model
from onnxblocks.runtime import TrainingSession

TESTS = Path(__file__).resolve().parents[1]


def listing(directory: Path) -> list[str]:
    """Every entry below ``directory`` (hidden ones too), relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def tensors(values: dict[str, np.ndarray]) -> list[TensorProto]:
    return [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in values.items()]


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
    return session.save_checkpoint(tmp_path_factory.mktemp("trained") / "ckpt", properties={"epoch": 1})


# =========================================================================== checkpoints against the model
def test_same_names_other_shapes_is_refused_before_ort(art, other_shapes):
    with pytest.raises(CheckpointMismatchError) as info:
        TrainingSession(art, checkpoint=other_shapes)
    message = str(info.value)
    for fragment in (str(other_shapes), "'fc1.weight'", "[2, 4]", "float32 [2, 16]", "same names but other shapes"):
        assert fragment in message, message
    assert "pass a checkpoint saved from these artifacts" in message
    session = TrainingSession(art)
    before = session.get_parameter("fc1.weight")
    with pytest.raises(CheckpointMismatchError, match="'fc1.weight' has shape \\[2, 4\\]"):
        session.load_checkpoint(other_shapes)
    np.testing.assert_array_equal(session.get_parameter("fc1.weight"), before)  # the session is untouched
    with pytest.raises(CheckpointMismatchError):
        check_checkpoint(other_shapes, art / "training_model.onnx")
    check_checkpoint(other_shapes)  # on its own, the file is fine


def test_foreign_checkpoint_is_not_a_checkpoint_of_this_model(art, tmp_path):
    save_checkpoint((tensors({"conv.weight": np.zeros((3, 3), np.float32)}), []), tmp_path / "foreign")
    with pytest.raises(CheckpointMismatchError, match="is not a checkpoint of the model 'training_model.onnx'") as e:
        TrainingSession(art, checkpoint=tmp_path / "foreign")
    assert "['conv.weight']" in str(e.value) and "'fc1.weight'" in str(e.value)


def test_checkpoint_with_a_trained_parameter_frozen_is_refused(art, tmp_path):
    ck = load_checkpoint(art / "checkpoint")
    trainable = {k: v for k, v in ck.trainable.items() if k != "fc2.bias"}
    save_checkpoint((tensors(trainable), tensors({"fc2.bias": ck["fc2.bias"]})), tmp_path / "frozen")
    with pytest.raises(CheckpointMismatchError, match=r"trains \[.*\]: \['fc2.bias'\] are frozen in it"):
        TrainingSession(art, checkpoint=tmp_path / "frozen")


def _group_without_name(trained: Path, target: Path) -> Path:
    """``trained`` with one byte changed: its optimizer group's vtable entry for ``group_name`` set to 0 (absent)."""
    data = bytearray(trained.read_bytes())
    root = fbs.Checkpoint.GetRootAs(bytes(data), 0)
    group = root.OptimizerGroups(0)
    table = group._tab.Pos
    vtable = table - int.from_bytes(data[table : table + 4], "little", signed=True)
    assert data[vtable + 5] == 0 and data[vtable + 4] != 0  # group_name is the first field: its voffset's low byte
    data[vtable + 4] = 0
    target.write_bytes(bytes(data))
    return target


def test_a_one_byte_corruption_that_crashes_onnx_runtime_is_refused_everywhere(art, trained, tmp_path, capsys):
    broken = _group_without_name(trained, tmp_path / "broken")
    # The hazard is real: ONNX Runtime itself dereferences the missing name (SIGSEGV).
    code = f"from onnxblocks._core.ort import capi; capi().load_checkpoint({str(broken)!r})"
    crashed = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert crashed.returncode < 0 or crashed.returncode > 128, crashed
    for call in (load_checkpoint, read_parameter_names, check_checkpoint):
        with pytest.raises(CheckpointFormatError, match="group name is missing"):
            call(broken)
    with pytest.raises(CheckpointFormatError, match=f"checkpoint '{broken}' > optimizer_groups\\[0\\]"):
        TrainingSession(art, checkpoint=broken)
    # the CLI: exit 3 with one line, not 139
    (tmp_path / "d.npz").write_bytes(b"")
    x, y = classification_data()
    np.savez(tmp_path / "d.npz", x=x, labels=y)
    assert main(["train", str(art), "--data", str(tmp_path / "d.npz"), "--resume", str(broken)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err.startswith("onnxblocks: error: ") and "group name is missing" in err and err.count("\n") == 1


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
    save_checkpoint((tensors({"fc1.wei\u00e9ght": np.zeros(2, np.float32)}), []), tmp_path / "latin")
    data = (tmp_path / "latin").read_bytes().replace("\u00e9".encode(), b"\xff\xfe")
    (tmp_path / "latin").write_bytes(data)
    with pytest.raises(CheckpointFormatError, match="is not UTF-8 text"):
        TrainingSession(art, checkpoint=tmp_path / "latin")


def test_load_checkpoint_to_model_refuses_a_checkpoint_matching_nothing(tmp_path):
    model = mlp_model()
    before = model.SerializeToString()
    save_checkpoint((tensors({"encoder.w": np.zeros(3, np.float32)}), []), tmp_path / "ck")
    with pytest.raises(ValueError, match="is not a checkpoint of this model: none of its parameters") as info:
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
    np.testing.assert_array_equal(inits["fc2.bias"], numpy_helper.to_array(model.graph.initializer[3]))
    with pytest.raises(ValueError, match=r"parameters \['loss.scale'\]"):
        load_checkpoint_to_model(tmp_path / "ck", model, strict=True)


def test_load_checkpoint_to_a_training_model_says_to_pass_the_inference_model(art):
    training = onnx.load(art / "training_model.onnx")
    with pytest.raises(ValueError, match="takes .* as graph inputs .*pass the inference model"):
        load_checkpoint_to_model(art / "checkpoint", training)


# =========================================================================== external data
def _external_model(directory: Path, location: str, length: int | None = None) -> Path:
    """``y = W`` with a 4-float ``W`` stored externally at ``location`` (relative to ``directory``)."""
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": "0"}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Identity", ["W"], ["y"])], "g", [], [helper.make_tensor_value_info("y", 1, [4])], [w]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = directory / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("location", ["../outside.bin", "/abs/outside.bin", "sub/../../outside.bin", "link.bin"])
def test_external_data_outside_the_model_directory_is_refused(tmp_path, location):
    (tmp_path / "outside.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "link.bin").symlink_to(tmp_path / "outside.bin")
    path = _external_model(model_dir, location)
    with pytest.raises(Exception) as onnx_refuses:  # what onnx.load does, for comparison
        onnx.load(path)
    assert type(onnx_refuses.value).__name__ == "ValidationError"
    model = onnx.load(path, load_external_data=False)
    before = listing(tmp_path)
    with pytest.raises(ValueError, match="Initializer 'W'") as info:
        save_checkpoint(([model.graph.initializer[0]], []), tmp_path / "ck", base_dir=model_dir)
    assert "symbolic link" in str(info.value) if location == "link.bin" else repr(location) in str(info.value)
    with pytest.raises(ValueError, match="Initializer 'W'"):
        save_model(model, tmp_path / "copy.onnx", base_dir=model_dir)
    with pytest.raises(ValueError, match="Initializer 'W'"):
        import onnxblocks

        with onnxblocks.base(model, model_path=path):
            pass
    with pytest.raises(ValueError, match=f"Cannot load '{path}' as an ONNX model"):
        load_model(path, load_external_data=True)
    assert listing(tmp_path) == before  # nothing written


@pytest.mark.parametrize("length", [8, 32])
def test_external_data_length_other_than_the_dims_need_is_refused(tmp_path, length):
    (tmp_path / "w.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    path = _external_model(tmp_path, "w.bin", length=length)
    model = onnx.load(path, load_external_data=False)
    before = listing(tmp_path)
    with pytest.raises(ValueError, match=f"Initializer 'W' declares {length} bytes .* need 16"):
        save_checkpoint(([model.graph.initializer[0]], []), tmp_path / "ck", base_dir=tmp_path)
    from onnxblocks import artifacts

    with pytest.raises(ValueError, match="Initializer 'W' declares"):
        artifacts.generate_artifacts(
            path, requires_grad=["W"], loss=None, optimizer=None, artifact_directory=tmp_path / "out"
        )
    assert listing(tmp_path) == before  # no unloadable checkpoint, no artifact directory


def test_external_data_past_the_end_of_its_file_is_refused(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(2, dtype=np.float32).tobytes())
    model = onnx.load(_external_model(tmp_path, "w.bin"), load_external_data=False)
    with pytest.raises(ValueError, match="'W' needs bytes 0..16 of .*which has only 8 bytes"):
        save_checkpoint(([model.graph.initializer[0]], []), tmp_path / "ck", base_dir=tmp_path)
    assert not (tmp_path / "ck").exists()


def test_bad_model_files_raise_value_errors_naming_them(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    with pytest.raises(ValueError, match=f"Cannot load '{tmp_path / 'junk.onnx'}' as an ONNX model"):
        load_model(tmp_path / "junk.onnx")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        load_model(tmp_path)


# =========================================================================== saving: the pair, temp files, umask
def _values(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((64,), v, np.float32), "b": np.full((16,), v, np.float32)}


def _ort_values(path: Path) -> dict[str, np.ndarray]:
    state = capi().load_checkpoint(os.fspath(path))  # (kept alive while its parameters are read)
    return {n: np.array(state.get_parameter(n).data.numpy(), copy=True) for n in state.parameter_names()}


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
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_temp_files_of_killed_saves_are_removed_by_the_next_save(art, tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    stale = [
        f".ck.{dead}-0123456789ab.tmp",
        f".ck.{dead}-0123456789ab.tmp.data",
        f".model.onnx.{dead}-ba9876543210.tmp",
    ]
    keep = [f".ck.{alive}-00000000000a.tmp", ".ck.12345.tmp", "notes.txt"]  # a live writer's, not ours, the user's
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
        save_checkpoint((tensors(_values(2)), []), tmp_path / "ck", external_data_threshold=0)  # versioned
        TrainingSession(art).save_checkpoint(tmp_path / "new" / "session_ck")

    _created_with_umask(0o027, save_all)
    modes = {p: stat.S_IMODE(os.stat(tmp_path / p).st_mode) for p in listing(tmp_path) if "current" not in p}
    for path, mode in modes.items():
        is_dir = (tmp_path / path).is_dir()
        assert mode == (0o750 if is_dir else 0o640), (path, oct(mode))


# =========================================================================== runtime guards
@pytest.fixture(scope="module")
def ignore_art(tmp_path_factory):
    """Artifacts whose loss is CrossEntropyLoss(ignore_index=-100) (fused) and NLLLoss (composed), both models."""
    out = {}
    for name, loss in (
        ("ce_ignore", losses.CrossEntropyLoss(ignore_index=-100)),
        ("nll", losses.NLLLoss()),
        ("nll_ignore", losses.NLLLoss(ignore_index=-1)),
    ):
        out[name] = generate(tmp_path_factory.mktemp(name), loss=loss)
    return out


@pytest.mark.parametrize("check_inputs", [True, False])
def test_empty_batch_is_refused_before_onnx_runtime(art, check_inputs):
    session = TrainingSession(art, check_inputs=check_inputs)
    x, y = classification_data()
    for step in (session.train_step, session.eval_step):
        with pytest.raises(
            ValueError, match=r"got an empty batch: input 'x' has shape \(0, 2\), dimension 0 \('batch'"
        ):
            step(x[:0], y[:0])
    assert session.accumulated_steps == 0


@pytest.mark.parametrize("bad", [10**9, 3, -1])
def test_labels_out_of_range_are_refused_with_the_offending_value(art, bad):
    session = TrainingSession(art)
    x, y = classification_data()
    y = y.copy()
    y[5] = bad
    for step in (session.train_step, session.eval_step):
        with pytest.raises(ValueError) as info:
            step(x, y)
        message = str(info.value)
        for fragment in (f"input 'labels' holds {bad} at position (5,)", "3 classes of 'logits'", "[0, 3)"):
            assert fragment in message, message
    assert session.accumulated_steps == 0


def _torch_loss(kind: str, logits: np.ndarray, labels: np.ndarray, ignore_index: int) -> float:
    import torch

    t = torch.from_numpy(logits)
    target = torch.from_numpy(labels)
    if kind == "ce":
        return float(torch.nn.functional.cross_entropy(t, target, ignore_index=ignore_index))
    return float(torch.nn.functional.nll_loss(t, target, ignore_index=ignore_index))


@pytest.mark.parametrize(("name", "kind", "ignore"), [("ce_ignore", "ce", -100), ("nll_ignore", "nll", -1)])
def test_ignore_index_labels_are_accepted_and_the_loss_equals_torch(ignore_art, name, kind, ignore):
    session = TrainingSession(ignore_art[name])
    x, y = classification_data()
    y = y.copy()
    y[::4] = ignore
    loss, logits = session.eval_step(x, y)
    np.testing.assert_allclose(float(loss), _torch_loss(kind, logits, y, ignore), rtol=1e-5)
    y[1] = 3
    with pytest.raises(ValueError, match=rf"holds 3 at position \(1,\).*\[0, 3\) or \[{ignore}\] \(ignore_index\)"):
        session.train_step(x, y)


def test_composed_nll_without_ignore_index_refuses_minus_one(ignore_art):
    session = TrainingSession(ignore_art["nll"])
    x, y = classification_data()
    y = y.copy()
    y[2] = -1  # GatherElements would take it as the last class: a wrong loss, silently
    with pytest.raises(ValueError, match=r"holds -1 at position \(2,\).*GatherElements.*\[0, 3\)"):
        session.train_step(x, y)


# =========================================================================== arguments
@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda art: TrainingSession(3), "artifact_dir must be a path"),
        (lambda art: TrainingSession(art, checkpoint=7), "checkpoint must be a path"),
        (lambda art: TrainingSession(art, prefix=1), "prefix must be a str"),
        (lambda art: TrainingSession(art, check_inputs="yes"), "check_inputs must be True or False"),
        (lambda art: TrainingSession(art).save_checkpoint(3.5), "path must be a path"),
        (lambda art: TrainingSession(art).load_checkpoint(None), "path must be a path"),
        (lambda art: load_checkpoint(12), "path_to_checkpoint must be a path"),
        (lambda art: save_checkpoint(([], []), 12), "path_to_checkpoint must be a path"),
        (lambda art: save_model(mlp_model(), 5), "path must be a path"),
        (lambda art: load_model(b"model.onnx"), "path must be a path"),
    ],
)
def test_numbers_where_paths_are_expected_are_type_errors_naming_the_parameter(art, call, fragment):
    with pytest.raises(TypeError, match=fragment):
        call(art)


def test_output_paths_below_a_file_or_with_nul_bytes(art, tmp_path):
    session = TrainingSession(art)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="'.*file' is a file, not a directory"):
        session.save_checkpoint(tmp_path / "file" / "ck")
    with pytest.raises(ValueError, match="NUL character"):
        session.save_checkpoint(str(tmp_path / "c\0k"))
    with pytest.raises(IsADirectoryError):
        session.save_checkpoint(tmp_path)
    assert listing(tmp_path) == ["file"]


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
    code, out, err = run_cli(capsys, "train", art, "--data", tmp_path / "bad.npz", "--save", tmp_path / "ck")
    assert code == EXIT_INPUT and out == ""
    assert f"input 'labels' holds {bad} at position (9,)" in err and "[0, 3)" in err and "bad.npz" in err
    assert listing(tmp_path) == before  # nothing trained, nothing saved


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--export", ".", "is a directory"),
        ("--save", "file/ck", "is a file, not a directory"),
        ("--plot", "missing/loss.svg", "directory 'missing' does not exist"),
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
        assert done.returncode == 0, f"cannot make a read-only directory as root with chattr +i: {done.stderr}"
    yield directory
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    directory.chmod(0o755)


def test_cli_read_only_output_directory_exits_3_before_training(art, data, read_only, capsys):
    code, out, err = run_cli(capsys, "train", art, "--data", data, "--no-progress", "--save", read_only / "ck")
    assert code == EXIT_INPUT and out == "", err
    assert f"--save: cannot write '{read_only / 'ck'}': directory '{read_only}' is read-only" in err
    assert listing(read_only) == []
    with pytest.raises(PermissionError, match="is read-only"):
        TrainingSession(art).save_checkpoint(read_only / "ck")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--lr", "nan"], "--lr must be a finite number, got nan"),
        (["--lr", "-1"], "--lr must be >= 0"),
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
    code, _, err = run_cli(capsys, "artifacts", model, "--loss", "crossentropy", "--all-params", "-o", tmp_path / "out")
    assert code == EXIT_INPUT and "--output-dir: " in err and "exists and is not a directory" in err
    assert (tmp_path / "out").read_bytes() == b""


def test_cli_trains_good_data(art, data, tmp_path, capsys):
    code, out, _ = run_cli(capsys, "train", art, "--data", data, "--no-progress", "--save", tmp_path / "new" / "ck")
    assert code == EXIT_OK and "trained 2 steps" in out
    assert set(load_checkpoint(tmp_path / "new" / "ck").trainable) == set(PARAMS)


def test_no_warnings_from_the_guards(art):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = TrainingSession(art)
        session.train_step(*classification_data())


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

    def failing_save(path, include_optimizer_state):  # what ONNX Runtime raises when it cannot write
        raise capi().Fail(
            f"/onnxruntime_src/orttraining/checkpoint.cc:42 onnxruntime::common::Status onnxruntime::Save(const "
            f"std::string&) Failed to save checkpoint to file: {path}"
        )

    monkeypatch.setattr(session._backend, "save", failing_save)
    with pytest.raises(capi().Fail) as failed:
        session.save_checkpoint(tmp_path / "ck")
    assert str(failed.value) == f"Failed to save checkpoint to file: {tmp_path / 'ck'}"  # no C++, no temp name
    assert listing(tmp_path) == []


def test_cli_export_problems_are_found_before_training(art, data, tmp_path, capsys):
    args = ["train", art, "--data", data, "--no-progress", "--save", tmp_path / "ck", "--export", tmp_path / "m.onnx"]
    code, out, err = run_cli(capsys, *args, "--export-output", "logit")
    assert code == EXIT_INPUT and out == "" and "--export-output 'logit' is not a value of the eval model" in err
    assert "Did you mean 'logits'?" in err and listing(tmp_path) == ["train.npz"]
