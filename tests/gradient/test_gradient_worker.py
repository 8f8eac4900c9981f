"""The gradient builder in a worker Python (what a Python 3.13+ uses): same bytes, same errors, clear refusals.

Here the worker is this very interpreter (it has onnxruntime-training), forced with
``$ONNXBLOCKS_GRADIENT_BUILDER=worker``: the worker path is exercised on any Python.
The Python 3.13 run against 3.11 is in ``tests/artifacts/test_generate_any_python.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.onnx_models import make_linear_model

from onnxblocks import Block, losses
from onnxblocks.artifacts import OptimType, generate_artifacts
from onnxblocks.errors import GradientError, InvalidValueError, TrainingBuildRequiredError
from onnxblocks.gradient import build_training_graphs, worker, worker_process


class ScaledHuber(Block):
    """A custom loss Block, defined here: only its graph crosses to the worker."""

    def build(self, y: str) -> str:
        return losses.HuberLoss(delta=0.5)(y) * 0.25 + losses.L1Loss()(y) * 0.75


@pytest.fixture
def use_worker(monkeypatch):
    monkeypatch.setenv("ONNXBLOCKS_GRADIENT_BUILDER", "worker")
    monkeypatch.setenv("ONNXBLOCKS_TRAINING_PYTHON", sys.executable)
    worker._worker_python.cache_clear()
    yield
    worker._worker_python.cache_clear()


def _generate(directory):
    return generate_artifacts(
        make_linear_model(),
        requires_grad=["W", "b"],
        loss=ScaledHuber(),
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        ort_format=True,
    )


def test_the_worker_writes_the_same_artifacts_byte_for_byte(tmp_path, monkeypatch, use_worker):
    in_worker = _generate(tmp_path / "worker")
    monkeypatch.setenv("ONNXBLOCKS_GRADIENT_BUILDER", "in-process")
    in_process = _generate(tmp_path / "in_process")
    names = sorted(p.name for p in in_process.files)
    assert names == sorted(p.name for p in in_worker.files)
    assert "training_model.ort" in names  # the ORT format goes through the worker too
    for name in names:
        if name.endswith(
            ".ort"
        ):  # ORT writes its own format differently from run to run, even in one process
            ort_model = (tmp_path / "worker" / name).read_bytes()
            assert len(ort_model) > 1000 and ort_model[4:8] == b"ORTM", name
            continue
        assert (tmp_path / "worker" / name).read_bytes() == (
            tmp_path / "in_process" / name
        ).read_bytes(), name


def _model(nodes, outputs):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.ones(3, np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ROUND = _model(
    [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("Round", ["h"], ["r"], name="rounding"),
        helper.make_node("ReduceSum", ["r"], ["loss"], keepdims=0),
    ],
    [("loss", [])],
)
UNREACHABLE = _model(
    [
        helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0),
        helper.make_node("Mul", ["x", "w"], ["other"]),
    ],
    [("loss", []), ("other", [3])],
)


@pytest.mark.parametrize("model", [ROUND, UNREACHABLE], ids=["no_gradient_builder", "unreachable"])
def test_the_worker_explains_failures_as_in_process(model, monkeypatch, use_worker):
    with pytest.raises(GradientError) as in_worker:
        build_training_graphs(model, ["w"])
    monkeypatch.setenv("ONNXBLOCKS_GRADIENT_BUILDER", "in-process")
    with pytest.raises(GradientError) as in_process:
        build_training_graphs(model, ["w"])
    assert str(in_worker.value) == str(in_process.value)
    assert "rounding" in str(in_worker.value) or "does not depend differentiably on 'w'" in str(
        in_worker.value
    )


def test_no_python_for_the_worker_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("ONNXBLOCKS_TRAINING_PYTHON", raising=False)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TrainingBuildRequiredError) as info:
        worker.find_base_python()
    message = str(info.value)
    assert "no Python 3.10-3.12 to run it was found" in message
    assert "uv python install 3.12" in message and "$ONNXBLOCKS_TRAINING_PYTHON" in message


def test_a_training_python_of_the_wrong_version_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 3 13\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ONNXBLOCKS_TRAINING_PYTHON", str(fake))
    with pytest.raises(
        TrainingBuildRequiredError, match=r"is Python 3\.13; onnxruntime-training 1\.19\.2 needs"
    ):
        worker.find_base_python()
    monkeypatch.setenv("ONNXBLOCKS_TRAINING_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(TrainingBuildRequiredError, match="does not run as a Python interpreter"):
        worker.find_base_python()


def test_an_unknown_builder_choice_is_refused(monkeypatch):
    monkeypatch.setenv("ONNXBLOCKS_GRADIENT_BUILDER", "remote")
    with pytest.raises(InvalidValueError, match="set it to 'in-process' or 'worker'"):
        worker.uses_worker()


def test_a_broken_worker_is_reported(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(GradientError, match=r"failed \(exit 3\) without an answer:\nboom"):
        worker_process.exchange_once(fake, {"task": "probe"}, [], timeout=300)


def test_the_environment_is_created_once_with_progress_and_renamed_into_place(
    tmp_path, monkeypatch, capsys
):
    """The staging and progress of the first use, with venv and pip replaced by stand-ins (the real run is in
    tests/artifacts/test_generate_any_python.py, against a cached environment)."""
    commands = []

    def fake_run(argv, what):
        commands.append(argv[1:4])
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "python").write_text("")

    monkeypatch.setattr(worker, "_run_logged", fake_run)
    monkeypatch.setattr(
        worker, "probe", lambda python: {"training_build": True, "onnxruntime": "1.19.2"}
    )
    target = worker.environment_dir(Path(sys.executable), (3, 11), tmp_path)
    worker._create_environment(Path(sys.executable), (3, 11), target)
    err = capsys.readouterr().err
    assert "creating a Python 3.11 environment with onnxruntime-training-cpu==1.19.2" in err
    assert (
        "[1/3]" in err
        and "[2/3] installing onnxruntime-training-cpu==1.19.2" in err
        and "[3/3]" in err
    )
    assert worker.environment_ready(target) and [p.name for p in tmp_path.iterdir()] == [
        target.name
    ]
    assert commands[0][:2] == ["-m", "venv"] and commands[1] == ["-m", "pip", "install"]


def test_an_environment_without_the_training_build_is_not_kept(tmp_path, monkeypatch):
    def fake_run(argv, what):
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)

    monkeypatch.setattr(worker, "_run_logged", fake_run)
    monkeypatch.setattr(
        worker, "probe", lambda python: {"training_build": False, "onnxruntime": "1.32.0"}
    )
    target = worker.environment_dir(Path(sys.executable), (3, 11), tmp_path)
    with pytest.raises(
        TrainingBuildRequiredError, match="does not have onnxruntime-training 1.19.2"
    ):
        worker._create_environment(Path(sys.executable), (3, 11), target)
    assert list(tmp_path.iterdir()) == []  # no half-built environment left


def test_one_worker_serves_the_calls_and_is_restarted_when_it_died(use_worker):
    channel = worker._channel(worker.worker_python())
    first, _ = channel.exchange({"task": "probe"}, [], timeout=120)
    process = channel.process
    assert first["training_build"] is True and process is not None
    channel.exchange({"task": "probe"}, [], timeout=120)
    assert channel.process is process  # the same process answered twice
    process.kill()
    process.wait()
    again, _ = channel.exchange({"task": "probe"}, [], timeout=120)
    assert again == first and channel.process is not process


def test_a_worker_that_hangs_is_killed_at_its_timeout(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    channel = worker_process.Channel(fake)
    with pytest.raises(GradientError, match=r"did not answer in 1 s"):
        channel.exchange({"task": "probe"}, [], timeout=1)
    assert channel.process is None
