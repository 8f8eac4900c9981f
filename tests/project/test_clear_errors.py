"""Input that is simply wrong gets a clear error: the right type, the offender named, nothing foreign.

One test per kind of wrong input found by an adversarial run (each one example of a
class fixed as a class): each asserts the error class (an ``OnnxBlocksError`` that is
also the matching builtin), that the message names the argument or file, and that no
foreign text escapes (numpy's or protobuf's wording, ``[Errno ...]``, C++ source
paths, temporary names).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess

import numpy as np
import onnx
import pytest
from support.onnx_models import make_linear_model

from onnxblocks import LossType, OptimType, base, generate_artifacts, losses
from onnxblocks.checkpoint import save_checkpoint
from onnxblocks.errors import (
    CheckpointFormatError,
    FileAccessError,
    InvalidTypeError,
    InvalidValueError,
    IsAFolderError,
    OnnxBlocksError,
    OrtRunError,
)
from onnxblocks.runtime import TrainingSession, fit, load_npz
from onnxblocks.web import read_state, write_state

#: Text that must never reach a user: other libraries' wording, raw OS errors, C++ plumbing.
FOREIGN = (
    "[Errno",
    ".cc:",
    "onnxruntime_src",
    "DecodeError",
    "Wire format",
    "cannot reshape",
    "an integer is required",
    "bad argument type",
    "could not convert",
    "object is not iterable",
    "Traceback",
    ".tmp",
)


def _clear(exc: BaseException, *named: str) -> None:
    text = str(exc)
    assert isinstance(exc, OnnxBlocksError), f"{type(exc).__name__}: {text}"
    for name in named:
        assert name in text, f"{name!r} not named in: {text}"
    for foreign in FOREIGN:
        assert foreign not in text, f"{foreign!r} in: {text}"


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    directory = tmp_path_factory.mktemp("clear") / "artifacts"
    generate_artifacts(
        make_linear_model(),
        artifact_directory=directory,
        requires_grad=["W", "b"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        additional_output_names=["y"],
        portable=True,
    )
    return directory


def _batch(rows: int = 4):
    rng = np.random.default_rng(0)
    return rng.standard_normal((rows, 8)).astype(np.float32), rng.standard_normal((rows, 4)).astype(
        np.float32
    )


def _state_with(tmp_path, art, **entry):
    """The artifacts' state file with the entry of tensor 'W' changed."""
    path = write_state(art, tmp_path / "s.safetensors")
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header["W"].update(entry)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])
    return bad


@pytest.mark.parametrize("shape", [[2**32, 2**32], [True, 32], [-1, 4], [8, 4.0]])
def test_a_state_file_shape_that_cannot_be_is_refused_naming_file_and_tensor(tmp_path, art, shape):
    bad = _state_with(tmp_path, art, shape=shape)
    with pytest.raises(InvalidValueError) as info:
        read_state(bad)
    _clear(info.value, "bad.safetensors", "'W'", "shape")


def test_a_step_past_int64s_reach_is_refused_when_the_checkpoint_loads(tmp_path, art):
    session = TrainingSession(art)
    session.train_and_update(*_batch())
    good = session.save_checkpoint(tmp_path / "ck")
    raw = good.read_bytes()
    step = struct.pack("<q", 1)
    assert raw.count(step) >= 1
    bad = tmp_path / "bad-ck"
    bad.write_bytes(raw.replace(step, struct.pack("<q", 2**63 - 1)))
    with pytest.raises(CheckpointFormatError) as info:
        TrainingSession(art, checkpoint=bad)  # at load, not at the first step
    _clear(info.value, "bad-ck", "step")
    with pytest.raises(InvalidValueError) as info:
        session.step = 2**63 - 1
    _clear(info.value, "step")
    with pytest.raises(InvalidValueError) as info:
        save_checkpoint(
            ({"W": np.zeros(2, np.float32)}, {}), tmp_path / "c", properties={"onnxblocks.step": -1}
        )
    _clear(info.value, "onnxblocks.step")


def test_a_loss_target_given_as_a_number_names_the_argument():
    with pytest.raises(InvalidTypeError) as info, base(make_linear_model()):
        losses.MSELoss()("y", 3)
    _clear(info.value, "target_name", "int 3", "'y'")


@pytest.mark.parametrize(
    ("value", "error", "named"),
    [
        ("a", InvalidTypeError, "str 'a'"),
        (True, InvalidTypeError, "bool"),
        (float("nan"), InvalidValueError, "nan"),
        (-0.1, InvalidValueError, ">= 0"),
        (1e40, InvalidValueError, "float32"),
    ],
)
def test_a_learning_rate_that_is_not_one_names_the_argument(art, value, error, named):
    session = TrainingSession(art)
    before = session.learning_rate
    with pytest.raises(error) as info:
        session.learning_rate = value
    _clear(info.value, "learning_rate", named)
    assert session.learning_rate == before


def test_export_output_names_as_a_str_is_refused_not_iterated(art, tmp_path):
    session = TrainingSession(art)
    with pytest.raises(InvalidTypeError) as info:
        session.export_inference_model(tmp_path / "m.onnx", output_names="y")
    _clear(info.value, "output_names", "['y']")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("data", [None, 3, "batches"])
def test_fit_without_batches_names_the_argument(art, data):
    with pytest.raises(InvalidTypeError) as info:
        fit(TrainingSession(art), data)
    _clear(info.value, "train_data", "ArrayBatches")


def test_truncated_model_files_name_themselves_everywhere(tmp_path, art):
    from onnxblocks.display import render
    from onnxblocks.io import load_model

    broken = tmp_path / "broken"
    broken.mkdir()
    for path in art.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    raw = (art / "training_model.onnx").read_bytes()
    (broken / "training_model.onnx").write_bytes(raw[: len(raw) // 2])
    for call in (
        lambda: TrainingSession(broken),  # the portable backend
        lambda: render(broken / "training_model.onnx"),  # display
        lambda: load_model(broken / "training_model.onnx"),
    ):
        with pytest.raises(InvalidValueError) as info:
            call()
        _clear(info.value, "training_model.onnx")


def test_truncated_npz_names_itself(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((4, 8), np.float32))
    raw = path.read_bytes()
    for name, content in (
        ("cut.npz", raw[: len(raw) // 2]),
        ("flip.npz", raw[:60] + bytes([raw[60] ^ 0xFF]) + raw[61:]),
    ):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(InvalidValueError) as info:
            load_npz(tmp_path / name)
        _clear(info.value, name, "numpy.savez")


@pytest.fixture
def read_only(tmp_path):
    """A directory nobody can create files in (mode 0555; immutable with ``chattr +i`` as root)."""
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o555)
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
        assert done.returncode == 0, (
            f"cannot make a read-only directory as root with chattr +i: {done.stderr}"
        )
    yield directory
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    directory.chmod(0o755)


def test_writing_into_a_directory_or_a_read_only_one_names_the_path(tmp_path, art, read_only):
    with pytest.raises(IsAFolderError) as info:
        write_state(art, tmp_path)
    _clear(info.value, str(tmp_path), "directory")
    with pytest.raises(FileAccessError) as info:
        write_state(art, read_only / "s.safetensors")
    _clear(info.value, str(read_only / "s.safetensors"))
    assert list(read_only.iterdir()) == []


@pytest.mark.parametrize("portable", [True, False])
def test_onnx_runtime_failures_carry_no_cpp_source_paths(tmp_path, portable):
    directory = tmp_path / "art"
    generate_artifacts(
        make_linear_model(),
        artifact_directory=directory,
        requires_grad=["W"],
        loss=LossType.MSELoss,
        portable=portable,
    )
    session = TrainingSession(
        directory, check_inputs=False
    )  # ONNX Runtime meets the bad batch itself
    x, target = _batch(4)
    with pytest.raises(OrtRunError) as info:
        session.train_step(x, np.concatenate([target, target[:1]]))  # 5 target rows against 4
    _clear(info.value, "training model", "Sub", "4 by 5")


def test_onnx_function_on_an_empty_batch_gives_zero_gradients_as_torch():
    import torch

    from onnxblocks.torch import OnnxModule

    model = make_linear_model()
    module = OnnxModule(model, ["W", "b"])
    reference = torch.nn.Linear(8, 4)
    x = torch.zeros(0, 8, requires_grad=True)
    module(x).sum().backward()
    ref_x = torch.zeros(0, 8, requires_grad=True)
    reference(ref_x).sum().backward()
    grads = dict(module.named_parameters())
    np.testing.assert_array_equal(grads["W"].grad.numpy(), np.zeros((8, 4), np.float32))
    np.testing.assert_array_equal(grads["b"].grad.numpy(), reference.bias.grad.numpy())
    assert float(reference.weight.grad.abs().sum()) == 0.0
    assert x.grad.shape == ref_x.grad.shape == (0, 8)
    assert onnx.checker.check_model(model) is None
