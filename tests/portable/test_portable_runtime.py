"""The portable backend and the checkpoint format both backends share (Python 3.11, onnxruntime-training 1.19.2).

The portable backend runs here on the training build's ``InferenceSession`` (plain
inference kernels); ``test_portable_runtime_py313.py`` runs it on stock onnxruntime.
The portable artifacts are the hand-written linear model of ``portable_linear.py``;
its numbers are checked against torch eager AdamW, run in float32 and in float64
(``support.numerics``).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from support import portable_linear as pl
from support.adamw_oracle import torch_adamw
from support.numerics import assert_close
from support.runtime_support import classification_data, generate

from onnxblocks.artifacts import LossType, OptimType, generate_artifacts
from onnxblocks.checkpoint import load_checkpoint, save_checkpoint
from onnxblocks.errors import OnnxBlocksError
from onnxblocks.runtime import ArrayBatches, TrainingSession, fit


@pytest.fixture(scope="module")
def linear_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("portable")
    return {"fused": pl.write(root / "fused"), "unfused": pl.write(root / "unfused", fused=False)}


@pytest.fixture(scope="module")
def linear_training_build(tmp_path_factory):
    """The same linear model and loss, as training-build artifacts (for moving checkpoints between backends)."""
    model = pl.forward_model()
    directory = tmp_path_factory.mktemp("linear_training")
    generate_artifacts(
        model,
        requires_grad=["W", "b"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
    )
    return directory


# ------------------------------------------------------------------ the checkpoint format, ORT's layout
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_rewritten_ort_checkpoint_is_byte_identical_and_resumes_bit_exactly(tmp_path, optimizer):
    directory = generate(tmp_path / "a", optimizer=optimizer)
    x, y = classification_data(48)
    session = TrainingSession(directory, backend="training")
    session.learning_rate = 0.01
    for i in range(5):
        session.train_and_update(x[i * 8 : i * 8 + 8], y[i * 8 : i * 8 + 8])
    saved = session.save_checkpoint(
        tmp_path / "ort", properties={"note": "x", "ratio": 0.5, "big": 2**40}
    )
    expected = [session.train_and_update(x[:16], y[:16])[0] for _ in range(5)]

    ck = load_checkpoint(saved)
    group = ck.optimizer_state["group0"]
    assert group["step"] == 5
    assert {len(m) for m in group["moments"].values()} == {2 if optimizer == "adamw" else 1}
    assert ck.properties["onnxblocks.step"] == 5
    for threshold, name in ((None, "ours"), (0, "ours_external")):
        kwargs = {} if threshold is None else {"external_data_threshold": threshold}
        ours = save_checkpoint(
            (ck.trainable, ck.frozen),
            tmp_path / name,
            optimizer_state=ck.optimizer_state,
            properties=ck.properties,
            **kwargs,
        )
        if threshold is None:
            assert ours.read_bytes() == saved.read_bytes()
        resumed = TrainingSession(directory, checkpoint=ours, backend="training")
        resumed.learning_rate = (
            0.01  # ONNX Runtime restores the initial learning rate, not the current one
        )
        assert (
            resumed.step == 5
            and resumed.properties["note"] == "x"
            and resumed.properties["big"] == 2**40
        )
        got = [resumed.train_and_update(x[:16], y[:16])[0] for _ in range(5)]
        assert [float(a) for a in got] == [float(b) for b in expected], name
        for p in session.parameter_names():
            np.testing.assert_array_equal(resumed.get_parameter(p), session.get_parameter(p))


def test_checkpoint_writer_refuses_bad_optimizer_state_and_properties(tmp_path):
    params = ({"w": np.ones((2, 3), np.float32)}, {})
    state = {
        "group0": {
            "step": 1,
            "initial_learning_rate": 1e-3,
            "moments": {"v": [np.zeros((2, 3), np.float32)]},
        }
    }
    with pytest.raises(ValueError, match="moments of 'v', which is not a trainable parameter"):
        save_checkpoint(params, tmp_path / "c", optimizer_state=state)
    state["group0"]["moments"] = {"w": [np.zeros((3, 2), np.float32)]}
    with pytest.raises(ValueError, match=r"moment 'momentum0' of parameter 'w'.*shape \[3, 2\]"):
        save_checkpoint(params, tmp_path / "c", optimizer_state=state)
    with pytest.raises(ValueError, match="lacks"):
        save_checkpoint(params, tmp_path / "c", optimizer_state={"group0": {"step": 1}})
    with pytest.raises(TypeError, match="property 'flag' is a bool"):
        save_checkpoint(params, tmp_path / "c", properties={"flag": True})
    with pytest.raises(ValueError, match="nominal checkpoint"):
        save_checkpoint(params, tmp_path / "c", nominal_checkpoint=True, optimizer_state=state)
    assert not (tmp_path / "c").exists()
    written = save_checkpoint(params, tmp_path / "c", properties={"i": -3, "f": 0.25, "s": "é"})
    assert load_checkpoint(written).properties == {"i": -3, "f": 0.25, "s": "é"}


# ------------------------------------------------------------------ the portable backend
def _assert_tracks_torch(losses, session: TrainingSession, batches, **adamw) -> None:
    """The losses and final parameters against torch AdamW's, in float32 and float64 (rtol 1e-5)."""
    expected_losses, expected_params = torch_adamw(batches, lr=0.01, **adamw)
    losses64, params64 = torch_adamw(batches, lr=0.01, dtype=torch.float64, **adamw)
    assert_close(
        np.float32(losses), np.float32(expected_losses), losses64, rtol=1e-5, name="losses"
    )
    for name, value in expected_params.items():
        assert_close(session.get_parameter(name), value, params64[name], rtol=1e-5, name=name)


@pytest.mark.parametrize("kind", ["fused", "unfused"])
def test_portable_adamw_matches_torch(linear_dirs, kind):
    batches = pl.batches(8)
    session = TrainingSession(linear_dirs[kind])
    assert session.backend == "portable" and session.has_fused_step == (kind == "fused")
    session.learning_rate = 0.01
    losses = [float(session.train_and_update(x, t)[0]) for x, t in batches]
    _assert_tracks_torch(losses, session, batches)
    assert session.step == 8 and int(session.step) == 8


def test_portable_accumulation_and_lazy_reset(linear_dirs):
    batches = pl.batches(6)
    session = TrainingSession(linear_dirs["fused"])
    assert session.gradients() == {}

    def torch_grads(*chosen, dtype=torch.float32):
        params = {
            n: torch.tensor(v, dtype=dtype, requires_grad=True)
            for n, v in session.parameters().items()
        }
        for x, t in chosen:
            x, t = torch.from_numpy(x).to(dtype), torch.from_numpy(t).to(dtype)
            ((x @ params["W"] + params["b"] - t) ** 2).mean().backward()
        return {n: p.grad.numpy() for n, p in params.items()}

    def terms(*chosen):
        """The sums of |terms| of dW = 2/n x^T r and db = 2/n sum r (the floor's scale)."""
        params = {n: v.astype(np.float64) for n, v in session.parameters().items()}
        total = {n: np.zeros_like(v) for n, v in params.items()}
        for x, t in chosen:
            r = np.abs(x.astype(np.float64) @ params["W"] + params["b"] - t) * 2 / t.size
            total["W"] += np.abs(x).T @ r
            total["b"] += r.sum(axis=0)
        return total

    def assert_gradients(*chosen):
        expected, expected64, scale = (
            torch_grads(*chosen),
            torch_grads(*chosen, dtype=torch.float64),
            terms(*chosen),
        )
        for name, value in expected.items():
            assert_close(
                session.gradients()[name],
                value,
                expected64[name],
                rtol=1e-5,
                scale=scale[name],
                name=name,
            )

    session.train_step(*batches[0])
    session.train_step(*batches[1])
    assert session.accumulated_steps == 2
    assert_gradients(batches[0], batches[1])
    session.lazy_reset_grad()
    session.train_step(*batches[2])
    assert_gradients(batches[2])
    session.optimizer_step()
    with pytest.raises(RuntimeError, match="no train_step ran"):
        session.optimizer_step()
    # accumulating with fit matches torch accumulating two batches per step
    session = TrainingSession(linear_dirs["fused"])
    session.learning_rate = 0.01
    history = fit(session, list(batches), epochs=1, accumulation_steps=2, progress=False)
    _assert_tracks_torch(history.losses, session, batches, accumulate=2)
    assert history.steps == 3 == session.step


@pytest.mark.parametrize("kind", ["fused", "unfused"])
def test_portable_resume_is_bit_exact(linear_dirs, tmp_path, kind):
    batches = pl.batches(8)
    session = TrainingSession(linear_dirs[kind])
    for x, t in batches[:4]:
        session.train_and_update(x, t)
    path = session.save_checkpoint(tmp_path / "ck", properties={"epoch": 2, "history": [1.5, 2.5]})
    straight = [session.train_and_update(x, t)[0] for x, t in batches[4:]]
    resumed = TrainingSession(linear_dirs[kind], checkpoint=path)
    assert resumed.step == 4 and resumed.properties["history"] == [1.5, 2.5]
    again = [resumed.train_and_update(x, t)[0] for x, t in batches[4:]]
    assert [float(a) for a in again] == [float(b) for b in straight]
    for name in session.parameter_names():
        np.testing.assert_array_equal(resumed.get_parameter(name), session.get_parameter(name))
    # load_checkpoint into a live session rewinds it the same way
    assert session.load_checkpoint(path)["epoch"] == 2
    assert [float(session.train_and_update(x, t)[0]) for x, t in batches[4:]] == [
        float(b) for b in straight
    ]


def test_fit_takes_one_fused_step_per_batch(linear_dirs):
    batches = pl.batches(6)
    manual = TrainingSession(linear_dirs["fused"])
    expected = [float(manual.train_and_update(x, t)[0]) for x, t in batches]
    session = TrainingSession(linear_dirs["fused"])
    history = fit(
        session,
        ArrayBatches(_stack(batches), batch_size=8, shuffle=False),
        epochs=1,
        progress=False,
    )
    assert history.losses == expected and history.steps == 6


def _stack(batches):
    return tuple(np.concatenate([b[i] for b in batches]) for i in range(2))


def test_a_run_moves_between_the_backends(linear_dirs, linear_training_build, tmp_path):
    """Checkpoints carry parameters, moments and the step count from one backend to the other."""
    batches = pl.batches(8)
    # training build -> portable
    first = TrainingSession(linear_training_build, backend="training")
    first.learning_rate = 0.01
    losses = [float(first.train_and_update(x, t)[0]) for x, t in batches[:4]]
    path = first.save_checkpoint(tmp_path / "from_training")
    second = TrainingSession(linear_dirs["fused"], checkpoint=path)
    assert second.backend == "portable" and second.step == 4
    second.learning_rate = 0.01
    losses += [float(second.train_and_update(x, t)[0]) for x, t in batches[4:]]
    _assert_tracks_torch(losses, second, batches)
    # portable -> training build (ONNX Runtime's Optimizer takes the moments and step the portable backend wrote)
    first = TrainingSession(linear_dirs["unfused"])
    first.learning_rate = 0.01
    losses = [float(first.train_and_update(x, t)[0]) for x, t in batches[:4]]
    path = first.save_checkpoint(tmp_path / "from_portable")
    second = TrainingSession(linear_training_build, checkpoint=path)
    assert second.backend == "training" and second.step == 4
    second.learning_rate = 0.01
    losses += [float(second.train_and_update(x, t)[0]) for x, t in batches[4:]]
    _assert_tracks_torch(losses, second, batches)


def test_portable_export_and_parameters(linear_dirs, tmp_path):
    import onnxruntime as ort

    session = TrainingSession(linear_dirs["fused"])
    x, t = pl.batches(1)[0]
    session.train_and_update(x, t)
    w = session.get_parameter("W")
    session.set_parameter("W", w * 2)
    np.testing.assert_array_equal(session.get_parameter("W"), w * 2)
    with pytest.raises(ValueError, match="parameter 'W' is float32 with shape"):
        session.set_parameter("W", np.zeros((2, 2), np.float32))
    path = session.export_inference_model(tmp_path / "model.onnx", ["y"])
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["x"] and [
        o.name for o in model.graph.output
    ] == ["y"]
    inference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(inference.run(None, {"x": x})[0], session.eval_step(x, t)[1])
    with pytest.raises(ValueError, match=r"outputs \['nope'\]"):
        session.export_inference_model(tmp_path / "bad.onnx", ["nope"])
    assert session.num_parameters == pl.IN * pl.OUT + pl.OUT
    session.learning_rate = 0.125
    assert session.learning_rate == 0.125


def test_backend_choice_errors(linear_dirs, tmp_path):
    training = generate(tmp_path / "a")
    with pytest.raises(ValueError, match="portable backend only"):
        TrainingSession(linear_dirs["fused"], backend="training")
    with pytest.raises(ValueError, match=r"not portable.*portable=True"):
        TrainingSession(training, backend="portable")
    with pytest.raises(ValueError, match="backend must be one of"):
        TrainingSession(training, backend="gpu")
    assert TrainingSession(training).backend == "training"
    other = copy.deepcopy(load_checkpoint(training / "checkpoint"))
    save_checkpoint((other.trainable, other.frozen), tmp_path / "other")
    with pytest.raises(ValueError, match="checkpoint saved from these artifacts"):
        TrainingSession(linear_dirs["fused"], checkpoint=tmp_path / "other")


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_generated_portable_artifacts_follow_the_training_build(tmp_path, optimizer):
    """generate_artifacts(portable=True) artifacts on the portable backend, against the training build's."""
    from support.runtime_support import PARAMS, mlp_model

    dirs = {}
    for portable in (True, False):
        dirs[portable] = tmp_path / f"portable_{portable}"
        generate_artifacts(
            mlp_model(),
            requires_grad=PARAMS,
            loss=LossType.CrossEntropyLoss,
            optimizer=OptimType[{"adamw": "AdamW", "sgd": "SGD"}[optimizer]],
            artifact_directory=dirs[portable],
            additional_output_names=["logits"],
            portable=portable,
        )
    x, y = classification_data(64)
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    sessions = {p: TrainingSession(d) for p, d in dirs.items()}
    assert sessions[True].backend == "portable" and sessions[False].backend == "training"
    losses: dict[bool, list[float]] = {True: [], False: []}
    for portable, session in sessions.items():
        session.learning_rate = 0.05
        for x_b, y_b in batches[:2]:
            losses[portable].append(float(session.train_and_update(x_b, y_b)[0]))
        session.train_step(*batches[2])  # and once through the training + optimizer models
        session.train_step(*batches[3])
        session.optimizer_step()
        session.save_checkpoint(tmp_path / f"ck_{portable}")
        losses[portable].append(float(session.eval_step(x, y)[0]))
    # two float32 backends of ours: no float64 truth, the floor from the losses' size
    assert_close(np.float32(losses[True]), np.float32(losses[False]), rtol=1e-5, name="losses")
    moments = load_checkpoint(tmp_path / "ck_True").optimizer_state["group0"]["moments"]
    assert {len(m) for m in moments.values()} == {2 if optimizer == "adamw" else 1}
    if optimizer == "sgd":  # ONNX Runtime's SGD keeps one moment of zeros
        assert all(not m[0].any() for m in moments.values())
    # each side resumes the other's checkpoint
    for portable in (True, False):
        crossed = TrainingSession(dirs[portable], checkpoint=tmp_path / f"ck_{not portable}")
        assert crossed.step == 3
        crossed.learning_rate = 0.05
        same = TrainingSession(dirs[not portable], checkpoint=tmp_path / f"ck_{not portable}")
        same.learning_rate = 0.05
        assert_close(
            crossed.train_and_update(*batches[0])[0],
            same.train_and_update(*batches[0])[0],
            rtol=1e-5,
        )


def test_demo_trains_portable_artifacts_on_the_portable_backend(tmp_path):
    import io

    from onnxblocks.demo import run_demo
    from onnxblocks.runtime import ArtifactFiles

    report = io.StringIO()
    result = run_demo(tmp_path / "demo", epochs=8, progress=False, stream=report, portable=True)
    files = ArtifactFiles.find(result.files["artifacts"])
    assert files.portable and files.step_model is not None
    assert "(portable backend)" in report.getvalue()
    # fractions of the validation rows: at most two of them may flip between the eval model's batches of 256
    # and one run of the inference model (top logits within rounding of each other)
    rows = len(np.load(result.files["validation_dataset"])["labels"])
    assert round(abs(result.eval_accuracy - result.inference_accuracy) * rows) <= 2
    assert result.history.losses[-1] < result.history.losses[0]


def test_optimizer_sequences_become_tensors(tmp_path):
    """SequenceAt/SequenceConstruct at constant positions become the tensors; other sequence use is wrapped."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from onnxblocks.portable.sequences import per_tensor_optimizer

    directory = pl.write(tmp_path / "a", fused=False, sequence_optimizer=True)
    params = [("W", TensorProto.FLOAT, (pl.IN, pl.OUT)), ("b", TensorProto.FLOAT, (pl.OUT,))]
    direct = per_tensor_optimizer(onnx.load(directory / "optimizer_model.onnx"), params)
    assert not {n.op_type for n in direct.model.graph.node} & {"SequenceAt", "SequenceConstruct"}
    seq = helper.make_tensor_sequence_value_info
    passthrough = helper.make_model(  # params.out = params, with sequence ops no constant SequenceAt can replace
        helper.make_graph(
            [
                helper.make_node("SequenceLength", ["params"], ["n"]),
                helper.make_node("Identity", ["params"], ["params.out"]),
            ],
            "opt",
            [
                helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
                seq("params", TensorProto.FLOAT, None),
            ],
            [
                seq("params.out", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("n", TensorProto.INT64, []),
            ],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    wrapped = per_tensor_optimizer(passthrough, params)
    ops = [n.op_type for n in wrapped.model.graph.node]
    assert ops.count("SequenceConstruct") == 1 and ops.count("SequenceAt") == 2
    values = {"W": np.arange(6, dtype=np.float32).reshape(3, 2), "b": np.ones(2, np.float32)}
    session = ort.InferenceSession(
        wrapped.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feeds = {wrapped.inputs[("params", i)]: values[p] for i, (p, _, _) in enumerate(params)}
    feeds["learning_rate"] = np.ones(1, np.float32)
    names = [wrapped.outputs[("params", i)] for i in range(2)]
    for (p, _, _), got in zip(params, session.run(names, feeds), strict=True):
        np.testing.assert_array_equal(got, values[p])
    with pytest.raises(ValueError, match="params.out"):
        per_tensor_optimizer(
            helper.make_model(
                helper.make_graph(
                    [helper.make_node("Identity", ["params"], ["other"])],
                    "bad",
                    [seq("params", TensorProto.FLOAT, None)],
                    [seq("other", TensorProto.FLOAT, None)],
                ),
                opset_imports=[helper.make_opsetid("", 17)],
            ),
            params,
        )


#: Portable artifacts as onnxblocks wrote them before the optimizer model took one tensor per parameter (its
#: optimizer model takes tensor sequences): the linear model of portable_linear.py, MSE, AdamW, from
#: ``generate_artifacts(..., portable=True)`` of that release (see tests/data/portable_sequence_optimizer/README.md).
SEQUENCE_LAYOUT = Path(__file__).parents[1] / "data" / "portable_sequence_optimizer"


def test_artifacts_of_the_sequence_layout_are_refused_with_the_command_that_regenerates_them(
    tmp_path,
):
    hand_written = pl.write(tmp_path / "hand", fused=False, sequence_optimizer=True)
    for directory in (SEQUENCE_LAYOUT, hand_written):
        with pytest.raises(OnnxBlocksError, match=r"tensor sequences.*--portable.*portable=True"):
            TrainingSession(directory)
    generate_artifacts(
        pl.forward_model(),
        requires_grad=["W", "b"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "regenerated",
        portable=True,
    )
    session = TrainingSession(tmp_path / "regenerated")
    x, t = pl.batches(1)[0]
    session.train_step(x, t)
    session.optimizer_step()


def test_a_sequence_optimizer_model_converted_offline_trains_like_a_regenerated_one(tmp_path):
    """``per_tensor_optimizer`` turns the first layout's optimizer model into the one the runtime runs."""
    import shutil

    from onnx import TensorProto

    from onnxblocks.portable.sequences import per_tensor_optimizer

    old = shutil.copytree(SEQUENCE_LAYOUT, tmp_path / "old")
    params = [("W", TensorProto.FLOAT, (pl.IN, pl.OUT)), ("b", TensorProto.FLOAT, (pl.OUT,))]
    converted = per_tensor_optimizer(onnx.load(old / "optimizer_model.onnx"), params)
    onnx.save(converted.model, old / "optimizer_model.onnx")
    generate_artifacts(
        pl.forward_model(),
        requires_grad=["W", "b"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "new",
        portable=True,
    )
    sessions = [TrainingSession(old), TrainingSession(tmp_path / "new")]
    for x, t in pl.batches(3):
        for session in sessions:
            session.train_step(x, t)
            session.optimizer_step()
            session.lazy_reset_grad()
    for name in ("W", "b"):
        np.testing.assert_array_equal(*(s.get_parameter(name) for s in sessions))


def test_the_portable_runtime_needs_no_graph_tooling(linear_dirs):
    """Training portable artifacts loads and binds them as written: onnx_ir is never imported (nor needed)."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['onnx_ir'] = None\n"  # an import of it now fails
        "from support import portable_linear as pl\n"
        "from onnxblocks.runtime import TrainingSession\n"
        f"for directory in {[str(d) for d in linear_dirs.values()]!r}:\n"
        "    session = TrainingSession(directory)\n"
        "    x, t = pl.batches(1)[0]\n"
        "    session.train_step(x, t); session.optimizer_step(); session.train_and_update(x, t)\n"
        "print('trained')\n"
    )
    tests = str(Path(__file__).parents[1])
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tests,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-3000:]


def test_an_optimizer_model_of_other_artifacts_is_refused_at_load(tmp_path):
    directory = pl.write(tmp_path / "a", fused=False)
    model = onnx.load(directory / "optimizer_model.onnx")
    model.graph.input.append(onnx.helper.make_tensor_value_info("V", onnx.TensorProto.FLOAT, [3]))
    onnx.save(model, directory / "optimizer_model.onnx")
    with pytest.raises(
        ValueError, match=r"takes \['V'\], which are not this checkpoint's trainable parameters"
    ):
        TrainingSession(directory)
