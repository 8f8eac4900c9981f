"""The torch-free runtime against ONNX Runtime's own training API, formulas and torch's schedulers."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
import pytest
from support.numerics import assert_close, assert_equal
from support.runtime_support import PARAMS, classification_data, generate, mlp_model

from onnxblocks.errors import UnknownNameError
from onnxblocks.runtime import (
    Accuracy,
    ArrayBatches,
    EarlyStopping,
    ProgressBar,
    SaveCheckpoint,
    TrainingSession,
    evaluate,
    fit,
    make_schedule,
    resume,
    schedule_from_dict,
)
from onnxblocks.runtime import plot as plotting
from onnxblocks.runtime.schedules.warmup import (
    ConstantSchedule,
    CosineSchedule,
    LinearSchedule,
    StepSchedule,
)


@pytest.fixture(scope="module")
def adamw_dir(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("adamw"), optimizer="adamw")


@pytest.fixture(scope="module")
def sgd_sum_dir(tmp_path_factory):
    """MLP regression with a sum-reduced MSE and SGD: gradients of half batches add up to the full batch's."""
    from onnxblocks import losses

    return generate(
        tmp_path_factory.mktemp("sgd_sum"), loss=losses.MSELoss(reduction="sum"), optimizer="sgd"
    )


@pytest.fixture(scope="module")
def half_mean_dir(tmp_path_factory):
    """Mean cross entropy scaled by 0.5 (Value arithmetic): two accumulated half batches = one full batch."""
    from onnxblocks import Block, losses

    class HalfMeanCE(Block):
        def build(self, logits: str) -> str:
            return losses.CrossEntropyLoss()(logits) * 0.5

    return generate(tmp_path_factory.mktemp("half"), loss=HalfMeanCE(), optimizer="sgd")


@pytest.fixture(scope="module")
def mean_dir(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("mean"), optimizer="sgd")


@pytest.fixture
def data():
    return classification_data(48)


def batches(x, y, size=16):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


# ------------------------------------------------------------- ORT parity
def ort_api(directory):
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = Module(
        str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx")
    )
    return state, module, Optimizer(str(directory / "optimizer_model.onnx"), module)


def test_training_matches_ort_training_api(adamw_dir, data):
    x, y = data
    state, module, optimizer = ort_api(adamw_dir)
    session = TrainingSession(adamw_dir)
    for xb, yb in batches(x, y) * 2:
        theirs = module(xb, yb)
        optimizer.step()
        module.lazy_reset_grad()
        ours = session.train_step(xb, yb)
        session.optimizer_step()
        np.testing.assert_array_equal(ours[0], theirs[0])
        np.testing.assert_array_equal(ours[1], theirs[1])
    for name in PARAMS:
        np.testing.assert_array_equal(session.get_parameter(name), state.parameters[name].data)
    module.eval()
    np.testing.assert_array_equal(session.eval_step(x, y)[0], module(x, y)[0])
    assert session.step == 6
    assert np.float32(session.learning_rate) == np.float32(
        optimizer.get_learning_rate()
    )  # one float32 rate


def test_learning_rate_set_matches_ort(adamw_dir, data):
    x, y = data
    state, module, optimizer = ort_api(adamw_dir)
    session = TrainingSession(adamw_dir)
    session.learning_rate = 0.03
    optimizer.set_learning_rate(0.03)
    module(x, y)
    optimizer.step()
    session.train_step(x, y)
    session.optimizer_step()
    assert np.float32(session.learning_rate) == np.float32(0.03)
    np.testing.assert_array_equal(
        session.get_parameter("fc1.weight"), state.parameters["fc1.weight"].data
    )
    with pytest.raises(ValueError, match="learning_rate must be"):
        session.learning_rate = -1.0


def test_linear_schedule_matches_ort_linear_lr_scheduler(adamw_dir, data):
    """ONNX Runtime's C++ LinearLRScheduler is the oracle (its binding takes total steps, then warmup steps)."""
    from onnxruntime.capi import _pybind_state as C

    x, y = data
    _, module, optimizer = ort_api(adamw_dir)
    total, warmup, base = 10, 3, 0.5
    scheduler = C.LinearLRScheduler(optimizer._optimizer, total, warmup, base)
    ours = LinearSchedule(base, total_steps=total, warmup_steps=warmup)
    got = [optimizer.get_learning_rate()]
    for _ in range(total + 2):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        scheduler.scheduler_step()
        got.append(optimizer.get_learning_rate())
    # ONNX Runtime's rates are float32; ours float64: float32 rounding of terms of order ``base``
    assert_close(
        np.array(ours.values(total + 3)), np.float32(got), rtol=1e-6, scale=base, name="rates"
    )


# ---------------------------------------------------------------- resume
def run_fit(directory, x, y, max_steps, checkpoint=None, resume_from=None, save_every=None):
    session = TrainingSession(directory)
    train = ArrayBatches((x, y), batch_size=10, seed=7)
    if resume_from is not None:
        resume(session, resume_from, train)
    callbacks = (
        [SaveCheckpoint(checkpoint, every_steps=save_every, at_epoch_end=False)]
        if checkpoint
        else []
    )
    schedule = CosineSchedule(0.05, total_steps=40, warmup_steps=4)
    history = fit(
        session,
        train,
        epochs=20,
        callbacks=callbacks,
        scheduler=schedule,
        accumulation_steps=2,
        progress=False,
        max_steps=max_steps,
    )
    return session, history


def test_resume_continues_bit_for_bit(adamw_dir, data, tmp_path):
    x, y = data
    full_session, full = run_fit(adamw_dir, x, y, max_steps=11)
    ckpt = tmp_path / "ckpt"
    first_session, first = run_fit(adamw_dir, x, y, max_steps=7, checkpoint=ckpt, save_every=7)
    assert ckpt.exists()
    assert first_session.properties["onnxblocks.data"]["position"] not in (
        0,
        None,
    )  # saved mid-epoch
    second_session, second = run_fit(adamw_dir, x, y, max_steps=4, resume_from=ckpt)
    assert second_session.step == 11
    assert first.losses + second.losses == full.losses  # exact, not approximate
    assert first.learning_rates + second.learning_rates == full.learning_rates
    for name in PARAMS:
        np.testing.assert_array_equal(
            second_session.get_parameter(name), full_session.get_parameter(name)
        )


def test_checkpoint_round_trip_properties_and_optimizer_state(adamw_dir, data, tmp_path):
    x, y = data
    session = TrainingSession(adamw_dir)
    for xb, yb in batches(x, y):
        session.train_step(xb, yb)
        session.optimizer_step()
    props = {"lr": 0.1, "epoch": 3, "note": "hi", "rng": {"state": [1, 2**70]}, "flag": True}
    path = session.save_checkpoint(tmp_path / "sub" / "ckpt", properties=props)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt"]  # no temp files left
    loaded = TrainingSession(adamw_dir, checkpoint=path)
    assert loaded.step == 3
    for key, value in props.items():
        assert loaded.properties[key] == value and type(loaded.properties[key]) is type(value)
    # same optimizer state: one more identical step gives identical parameters
    session.train_step(x, y)
    session.optimizer_step()
    loaded.train_step(x, y)
    loaded.optimizer_step()
    for name in PARAMS:
        np.testing.assert_array_equal(loaded.get_parameter(name), session.get_parameter(name))
    with pytest.raises(ValueError, match="reserves"):
        session.save_checkpoint(tmp_path / "bad", properties={"onnxblocks.step": 1})
    with pytest.raises(TypeError, match="cannot be stored"):
        session.save_checkpoint(tmp_path / "bad", properties={"obj": object()})
    assert not (tmp_path / "bad").exists()


def test_load_checkpoint_of_other_artifacts_is_rejected(adamw_dir, tmp_path):
    other = generate(tmp_path / "other", model=mlp_model(hidden=4), requires_grad=["fc1.weight"])
    session = TrainingSession(adamw_dir)
    with pytest.raises(ValueError, match="holds parameters"):
        session.load_checkpoint(other / "checkpoint")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        session.load_checkpoint(tmp_path / "missing")


# ---------------------------------------------------------- accumulation
def test_accumulated_half_batches_equal_full_batch_with_sum_loss(sgd_sum_dir, data):
    x, _ = data
    target = np.tile(x[:, :1], (1, 3)).astype(np.float32)
    full, accumulated = TrainingSession(sgd_sum_dir), TrainingSession(sgd_sum_dir)
    full.train_step(x, target)
    full.optimizer_step()
    half = len(x) // 2
    accumulated.train_step(x[:half], target[:half])
    accumulated.train_step(x[half:], target[half:])
    assert accumulated.accumulated_steps == 2
    accumulated.optimizer_step()
    for name in PARAMS:  # two runs of ours that sum the batch in another order: rtol and the floor
        assert_close(
            accumulated.get_parameter(name), full.get_parameter(name), rtol=1e-5, name=name
        )


def test_accumulated_half_batches_equal_full_batch_with_half_mean_loss(
    half_mean_dir, mean_dir, data
):
    x, y = data
    full, accumulated = TrainingSession(mean_dir), TrainingSession(half_mean_dir)
    full_loss = full.train_step(x, y)[0]
    full.optimizer_step()
    history = fit(
        accumulated, batches(x, y, size=len(x) // 2), epochs=1, accumulation_steps=2, progress=False
    )
    assert history.steps == 1
    assert_close(
        np.float32(sum(history.losses)),
        np.float32(full_loss),
        rtol=1e-5,
        name="the two halves' loss",
    )
    for name in PARAMS:
        assert_close(
            accumulated.get_parameter(name), full.get_parameter(name), rtol=1e-5, name=name
        )


def test_fit_accumulation_matches_manual_steps(adamw_dir, data):
    x, y = data
    manual, fitted = TrainingSession(adamw_dir), TrainingSession(adamw_dir)
    parts = batches(x, y, size=8)  # 6 batches -> 2 optimizer steps of 3 accumulated batches
    for i, (xb, yb) in enumerate(parts):
        manual.train_step(xb, yb)
        if i % 3 == 2:
            manual.optimizer_step()
    history = fit(fitted, parts, epochs=1, accumulation_steps=3, progress=False)
    assert history.steps == 2 and fitted.step == 2
    for name in PARAMS:
        np.testing.assert_array_equal(fitted.get_parameter(name), manual.get_parameter(name))


def test_artifacts_without_optimizer_train_nothing(tmp_path, data):
    session = TrainingSession(generate(tmp_path, optimizer=None))
    assert not session.has_optimizer
    loss = session.train_step(*data)[0]  # forward and backward still run
    assert np.isfinite(loss)
    for attempt in (
        session.optimizer_step,
        lambda: session.learning_rate,
        lambda: fit(session, [data]),
    ):
        with pytest.raises(RuntimeError, match="no optimizer model"):
            attempt()


def test_optimizer_step_without_gradients_is_an_error(adamw_dir, data):
    session = TrainingSession(adamw_dir)
    with pytest.raises(RuntimeError, match=r"Call train_step\(...\) first"):
        session.optimizer_step()


# ------------------------------------------------------- input checking
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda x, y: (x.astype(np.float64), y),
            r"input 'x' expects float32 with shape \[batch, 2\]; got float64",
        ),
        (
            lambda x, y: (x[:, :1], y),
            r"input 'x' expects float32 .*got float32 with shape \(48, 1\).*dimension 1",
        ),
        (
            lambda x, y: (x, y.astype(np.int32)),
            r"input 'labels' expects int64.*got int32.*astype\(np.int64\)",
        ),
        (lambda x, y: (x, y[:5]), r"input 'labels'.*'batch'.*is 5 but input 'x' has batch=48"),
        (
            lambda x, y: (x[None], y),
            r"input 'x' expects .*rank 2.*got float32 with shape \(1, 48, 2\)",
        ),
    ],
)
def test_bad_batches_name_the_input(adamw_dir, data, change, message):
    session = TrainingSession(adamw_dir)
    with pytest.raises(ValueError, match=message):
        session.train_step(*change(*data))
    with pytest.raises(ValueError, match=message):
        fit(session, [change(*data)], progress=False)


def test_wrong_number_of_inputs(adamw_dir, data):
    session = TrainingSession(adamw_dir)
    with pytest.raises(TypeError, match=r"train_step takes 2 input\(s\) \(x, labels\) but got 1"):
        session.train_step(data[0])


def test_dict_batches_are_ordered_by_input_name(adamw_dir, data):
    x, y = data
    a, b = TrainingSession(adamw_dir), TrainingSession(adamw_dir)
    ha = fit(a, [{"labels": y, "x": x}], progress=False)
    hb = fit(b, [(x, y)], progress=False)
    assert ha.losses == hb.losses
    with pytest.raises(KeyError, match="no array for input"):
        fit(a, [{"x": x}], progress=False)


# ------------------------------------------------------------ parameters
def test_parameter_access(adamw_dir, data):
    x, y = data
    session = TrainingSession(adamw_dir)
    params = session.parameters()
    assert sorted(params) == sorted(PARAMS)
    assert session.parameter_names(trainable_only=True) == sorted(PARAMS)
    params["fc1.bias"][:] = 123.0  # a copy: the session is unchanged
    assert not np.any(session.get_parameter("fc1.bias") == 123.0)
    new = np.full((2, 16), 0.25, np.float32)
    session.set_parameter("fc1.weight", new)
    np.testing.assert_array_equal(session.get_parameter("fc1.weight"), new)
    state, module, _ = ort_api(adamw_dir)
    state.parameters["fc1.weight"] = new
    np.testing.assert_array_equal(
        session.train_step(x, y)[0], module(x, y)[0]
    )  # the new value is used
    grads = session.gradients()
    np.testing.assert_array_equal(grads["fc2.weight"], state.parameters["fc2.weight"].grad)
    with pytest.raises(
        ValueError,
        match=r"parameter 'fc1.bias' is float32 with shape \(16,\); got float32 with shape",
    ):
        session.set_parameters({"fc1.weight": new, "fc1.bias": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(session.get_parameter("fc1.weight"), new)  # nothing written
    with pytest.raises(UnknownNameError, match="Did you mean 'fc1.bias'"):
        session.get_parameter("fc1.bais")
    assert session.num_parameters == 2 * 16 + 16 + 16 * 3 + 3


def test_export_inference_model_uses_trained_weights(adamw_dir, data, tmp_path):
    import onnxruntime as ort

    x, y = data
    session = TrainingSession(adamw_dir)
    fit(session, batches(x, y), epochs=2, progress=False)
    path = session.export_inference_model(tmp_path / "model.onnx")
    inference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in inference.get_inputs()] == ["x"]
    (logits,) = inference.run(None, {"x": x})
    assert_close(logits, session.eval_step(x, y)[1], rtol=1e-6, name="the exported model's logits")
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    with pytest.raises(ValueError, match="Cannot export outputs"):
        session.export_inference_model(tmp_path / "bad.onnx", ["no_such_output"])


def test_missing_artifacts_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TrainingSession(tmp_path / "nope")
    (tmp_path / "training_model.onnx").write_bytes(b"")
    with pytest.raises(
        FileNotFoundError, match=r"missing .*checkpoint.*It holds \['training_model.onnx'\]"
    ):
        TrainingSession(tmp_path)


# ------------------------------------------------------------- schedules
def test_schedule_formulas():
    assert ConstantSchedule(0.1).values(3) == [0.1, 0.1, 0.1]
    warm = ConstantSchedule(0.1, warmup_steps=4).values(6)
    assert_close(
        np.array(warm),
        np.array([0, 0.025, 0.05, 0.075, 0.1, 0.1]),
        rtol=1e-12,
        scale=0.1,
        name="warm-up",
    )
    linear = LinearSchedule(1.0, total_steps=10, warmup_steps=2, end_lr=0.1)
    want = [0, 0.5, 1.0] + [0.1 + 0.9 * (10 - t) / 8 for t in range(3, 11)] + [0.1]
    assert_close(np.array(linear.values(12)), np.array(want), rtol=1e-12, scale=1.0, name="linear")
    cosine = CosineSchedule(1.0, total_steps=12, warmup_steps=2, min_lr=0.2)
    expected = (
        [t / 2 for t in range(2)]
        + [0.2 + 0.8 * (1 + math.cos(math.pi * (t - 2) / 10)) / 2 for t in range(2, 13)]
        + [0.2]
    )
    assert_close(
        np.array(cosine.values(14)), np.array(expected), rtol=1e-12, scale=1.0, name="cosine"
    )
    assert StepSchedule(1.0, step_size=3, gamma=0.5).values(7) == [1, 1, 1, 0.5, 0.5, 0.5, 0.25]
    for schedule in (linear, cosine, StepSchedule(1.0, 3), ConstantSchedule(0.1, 2)):
        assert schedule_from_dict(schedule.state_dict()) == schedule
    assert make_schedule("cosine", 0.1, total_steps=5) == CosineSchedule(0.1, 5)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: LinearSchedule(0.1, total_steps=3, warmup_steps=3),
        lambda: CosineSchedule(-1.0, total_steps=3),
        lambda: StepSchedule(0.1, step_size=0),
        lambda: make_schedule("exp", 0.1),
        lambda: make_schedule("linear", 0.1),
    ],
)
def test_schedule_errors(bad):
    with pytest.raises(ValueError):
        bad()


def torch_lrs(make_scheduler, steps, base=1.0):
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base)
    scheduler = make_scheduler(optimizer)
    values = []
    for _ in range(steps):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


def test_schedules_match_torch():
    from torch.optim import lr_scheduler

    # float64 on both sides (torch's schedulers are Python floats): every rate is made of terms of order 1.0
    def check(ours, theirs, name):
        assert_close(np.array(ours), np.array(theirs), rtol=1e-12, scale=1.0, name=name)

    cosine = (
        torch_lrs(lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=20, eta_min=0.1), 21)
        + [0.1] * 4
    )
    check(CosineSchedule(1.0, total_steps=20, min_lr=0.1).values(25), cosine, "cosine")
    step = torch_lrs(lambda o: lr_scheduler.StepLR(o, step_size=4, gamma=0.3), 20)
    check(StepSchedule(1.0, step_size=4, gamma=0.3).values(20), step, "step")
    linear = torch_lrs(
        lambda o: lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=10), 14
    )
    check(LinearSchedule(1.0, total_steps=10).values(14), linear, "linear")
    warm = LinearSchedule(1.0, total_steps=10, warmup_steps=3)
    check(
        warm.values(12),
        torch_lrs(lambda o: lr_scheduler.LambdaLR(o, warm), 12),
        "warm-up through LambdaLR",
    )


def test_fit_applies_the_schedule_before_each_step(adamw_dir, data):
    x, y = data
    session = TrainingSession(adamw_dir)
    schedule = StepSchedule(0.01, step_size=2, gamma=0.5)
    history = fit(session, batches(x, y), epochs=2, scheduler=schedule, progress=False)
    assert_equal(
        np.float32(history.learning_rates), np.float32(schedule.values(6)), name="rates"
    )  # float32 in ORT


# --------------------------------------------------------- fit & callbacks
def test_fit_history_eval_and_accuracy(adamw_dir, data):
    x, y = data
    session = TrainingSession(adamw_dir)
    accuracy = Accuracy()
    history = fit(
        session,
        ArrayBatches((x, y), 16),
        epochs=3,
        eval_data=[(x[:30], y[:30]), (x[30:], y[30:])],
        callbacks=[accuracy],
        progress=False,
    )
    assert len(history.losses) == 9 and history.steps == 9 and history.samples == 3 * 48
    assert [e["epoch"] for e in history.epochs] == [1, 2, 3] and history.epoch_ends == [3, 6, 9]
    logits = session.eval_step(x, y)[1]
    correct = int(np.sum(logits.argmax(1) == y))
    assert history.metric("accuracy")[-1] == correct / len(y)  # a count over the samples, exact
    loss_a, loss_b = session.eval_step(x[:30], y[:30])[0], session.eval_step(x[30:], y[30:])[0]
    mean = (
        30 * np.float64(loss_a) + 18 * np.float64(loss_b)
    ) / 48  # the sample-weighted mean of two float32 losses
    assert_close(np.float64(history.metric("eval_loss")[-1]), mean, rtol=1e-6, name="eval loss")
    assert evaluate(session, [(x, y)], [Accuracy()])["accuracy"] == correct / len(y)
    with pytest.raises(KeyError, match="No epoch logged 'f1'"):
        history.metric("f1")


def test_early_stopping_stops(adamw_dir, data):
    x, y = data
    session = TrainingSession(adamw_dir)
    session.learning_rate = 0.0  # nothing improves
    history = fit(
        session,
        batches(x, y),
        epochs=10,
        eval_data=[(x, y)],
        callbacks=[EarlyStopping("eval_loss", patience=2)],
        progress=False,
    )
    assert len(history.epochs) == 3


def test_fit_rejects_one_shot_iterators_for_several_epochs(adamw_dir, data):
    session = TrainingSession(adamw_dir)
    with pytest.raises(ValueError, match="one-shot iterator"):
        fit(session, iter(batches(*data)), epochs=2, progress=False)


# ----------------------------------------------------------------- data
def test_array_batches_resume_mid_epoch():
    x = np.arange(23)
    a = ArrayBatches((x, -x), batch_size=5, seed=3)
    seen = [b[0] for _, b in zip(range(7), (batch for _ in range(3) for batch in a), strict=False)]
    state = a.state_dict()
    rest_a = [b[0] for b in a] + [b[0] for b in a]
    b = ArrayBatches((x, -x), batch_size=5, seed=99)
    b.load_state_dict(state)
    rest_b = [b[0] for b in b] + [b[0] for b in b]
    assert all(np.array_equal(p, q) for p, q in zip(rest_a, rest_b, strict=True))
    assert sorted(np.concatenate(seen[:5]).tolist()) == list(
        range(23)
    )  # one epoch = every row once
    assert len(ArrayBatches((x,), 5, drop_last=True)) == 4
    with pytest.raises(ValueError, match="same first dimension"):
        ArrayBatches((x, x[:3]), 5)
    with pytest.raises(ValueError, match="batch_size=5"):
        ArrayBatches((x,), 4).load_state_dict(state)


# ----------------------------------------------------------- progress bar
def test_progress_bar_lines():
    stream = io.StringIO()
    bar = ProgressBar(stream, dynamic=False)
    bar.start_epoch(1, 2, total=4)
    for loss in (1.0, 2.0, 3.0, 4.0):
        bar.update(loss, samples=8, lr=0.01)
    bar.end_epoch("eval_loss 0.5000")
    line = stream.getvalue()
    assert line.count("\n") == 1
    assert line.startswith("epoch 1/2 [####################] 4/4 loss 2.5000 lr 1.0e-02 ")
    assert "samples/s" in line and line.rstrip().endswith("| eval_loss 0.5000")
    live = io.StringIO()
    bar = ProgressBar(live, dynamic=True, refresh_hz=0)
    bar.start_epoch(1, 1, total=2)
    bar.update(1.0, 4)
    assert live.getvalue().startswith("\repoch 1/1 [##########..........] 1/2 loss 1.0000")


# ------------------------------------------------------------------ plots
def test_png_plot(tmp_path):
    # The home-made PNG encoder is gone (issue 9): PNG is drawn by matplotlib, SVG by onnxblocks.
    from matplotlib.image import imread

    path = plotting.save_line_plot(
        tmp_path / "p.png",
        {"a": [3.0, 2.0, 1.5, 1.0], "b": ([0, 3], [1.0, 3.0])},
        title="Loss",
        xlabel="step",
        ylabel="loss",
        width=320,
        height=200,
    )
    image = np.round(imread(path)[..., :3] * 255).astype(int)
    assert image.shape == (200, 320, 3)
    blue, red = np.array(plotting.PALETTE[0]), np.array(plotting.PALETTE[1])
    assert (np.abs(image - blue).sum(-1) < 30).sum() > 50  # series a drawn
    assert (np.abs(image - red).sum(-1) < 30).sum() > 50  # series b drawn
    assert (image == 255).all(-1).mean() > 0.5  # mostly white background
    with pytest.raises(ValueError, match="no finite points"):
        plotting.save_line_plot(tmp_path / "q.png", [-1.0, 0.0], log_y=True)


def test_plot_history_both_backends(adamw_dir, data, tmp_path):
    from onnxblocks.runtime import plot_history

    x, y = data
    history = fit(
        TrainingSession(adamw_dir), batches(x, y), epochs=2, eval_data=[(x, y)], progress=False
    )
    for backend in ("builtin", "matplotlib"):
        path = plot_history(history, tmp_path / f"{backend}.png", backend=backend)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plotting.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
    assert [plotting.format_tick(v) for v in (0, 2.5, 1e-5, 120000)] == [
        "0",
        "2.5",
        "1e-5",
        "1.2e5",
    ]


# ------------------------------------------------------------- importing
def test_import_is_lazy():
    code = "import sys, onnxblocks.runtime; print(sorted(m for m in sys.modules if m.startswith(('onnxruntime', 'torch'))))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
