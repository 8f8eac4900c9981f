"""Learning-rate schedules with torch's names against ``torch.optim.lr_scheduler``.

Each schedule's sequence over three times its ``T_max`` / ``step_size`` /
``total_iters`` (100 steps where it has none) equals what torch's scheduler
gives after the same number of ``step()`` calls, within 1e-12 relative (plus the
float64 floor of the base rate the schedule's terms are made of, for rates that reach
zero; ``support.numerics``). ``ReduceLROnPlateau`` follows a fixed
metric sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.numerics import assert_close, assert_equal
from torch.optim import lr_scheduler as L

from onnxblocks.errors import InvalidValueError
from onnxblocks.runtime import schedules as S
from onnxblocks.runtime.schedules import schedule_from_dict

BASE = 0.1


def _torch_sequence(make, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE)
    scheduler = make(opt)
    values = []
    for _ in range(steps):
        values.append(scheduler.get_last_lr()[0])
        opt.step()
        scheduler.step()
    return values


CASES = {
    "LinearLR": (
        lambda: S.LinearLR(BASE, 0.25, 0.9, total_iters=7),
        lambda o: L.LinearLR(o, 0.25, 0.9, 7),
        21,
    ),
    "LinearLR-defaults": (lambda: S.LinearLR(BASE), lambda o: L.LinearLR(o), 15),
    "CosineAnnealingLR": (
        lambda: S.CosineAnnealingLR(BASE, T_max=10, eta_min=1e-3),
        lambda o: L.CosineAnnealingLR(o, T_max=10, eta_min=1e-3),
        30,
    ),
    "CosineAnnealingLR-zero": (
        lambda: S.CosineAnnealingLR(BASE, 7),
        lambda o: L.CosineAnnealingLR(o, 7),
        21,
    ),
    "StepLR": (lambda: S.StepLR(BASE, 4, gamma=0.5), lambda o: L.StepLR(o, 4, gamma=0.5), 12),
    "MultiStepLR": (
        lambda: S.MultiStepLR(BASE, [3, 8, 9], 0.3),
        lambda o: L.MultiStepLR(o, [3, 8, 9], 0.3),
        27,
    ),
    "ExponentialLR": (lambda: S.ExponentialLR(BASE, 0.95), lambda o: L.ExponentialLR(o, 0.95), 100),
    "OneCycleLR": (
        lambda: S.OneCycleLR(BASE, 40),
        lambda o: L.OneCycleLR(o, BASE, total_steps=40),
        40,
    ),
    "OneCycleLR-linear-three-phase": (
        lambda: S.OneCycleLR(BASE, 30, pct_start=0.25, anneal_strategy="linear", three_phase=True),
        lambda o: L.OneCycleLR(
            o, BASE, total_steps=30, pct_start=0.25, anneal_strategy="linear", three_phase=True
        ),
        30,
    ),
    "LambdaLR": (
        lambda: S.LambdaLR(BASE, lambda t: 1 / (1 + t)),
        lambda o: L.LambdaLR(o, lambda t: 1 / (1 + t)),
        100,
    ),
    "SequentialLR-warmup-cosine": (
        lambda: S.SequentialLR(
            [S.LinearLR(BASE, 0.01, total_iters=5), S.CosineAnnealingLR(BASE, 20)], [5]
        ),
        lambda o: L.SequentialLR(
            o, [L.LinearLR(o, 0.01, total_iters=5), L.CosineAnnealingLR(o, 20)], [5]
        ),
        75,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sequence_equals_torch(case: str) -> None:
    ours, theirs, steps = CASES[case]
    expected = _torch_sequence(theirs, steps)
    got = ours().values(steps)
    # both float64: torch's sequence is the float64 reference; every rate is a sum of terms of order BASE
    assert_close(np.array(got), np.array(expected), rtol=1e-12, scale=BASE, name=case)


@pytest.mark.parametrize("case", sorted(c for c in CASES if not c.startswith("LambdaLR")))
def test_state_dict_round_trips(case: str) -> None:
    schedule = CASES[case][0]()
    again = schedule_from_dict(schedule.state_dict())
    assert again.values(30) == schedule.values(30)


def test_reduce_on_plateau_follows_torch_on_a_fixed_metric_sequence() -> None:
    metrics = [
        1.0,
        0.9,
        0.9,
        0.95,
        0.91,
        0.9,
        0.89,
        0.9,
        0.9,
        0.9,
        0.9,
        0.5,
        0.5,
        0.5,
        0.5,
        0.5,
        0.5,
        0.5,
    ]
    for options in ({"patience": 2}, {"patience": 1, "cooldown": 2, "factor": 0.5, "min_lr": 0.02}):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE)
        theirs = L.ReduceLROnPlateau(opt, **options)
        ours = S.ReduceLROnPlateau(BASE, **options)
        for m in metrics:
            theirs.step(m)
            assert_close(
                ours.step(m),
                opt.param_groups[0]["lr"],
                rtol=1e-12,
                scale=BASE,
                name=f"lr after {m}",
            )
    maxed = S.ReduceLROnPlateau(BASE, mode="max", patience=0, threshold_mode="abs", threshold=0.1)
    got = [maxed.step(m) for m in (1.0, 1.05, 1.2)]
    assert_close(np.array(got), np.array([BASE, BASE * 0.1, BASE * 0.1]), rtol=1e-12, scale=BASE)


def test_one_cycle_holds_its_final_rate_past_the_end_and_bad_settings_are_refused() -> None:
    one = S.OneCycleLR(BASE, 10)
    assert one(10) == one(50)
    assert_close(one(10), BASE / 25 / 1e4, rtol=1e-12, scale=BASE, name="OneCycleLR's final rate")
    # torch's cosine goes back up
    assert_close(
        S.CosineAnnealingLR(BASE, 10)(20), BASE, rtol=1e-12, name="CosineAnnealingLR at 2 T_max"
    )
    assert_close(S.StepLR(BASE, 2)(100), BASE * 0.1**50, rtol=1e-12, name="StepLR after 50 decays")
    with pytest.raises(InvalidValueError, match="T_max"):
        S.CosineAnnealingLR(BASE, 0)
    with pytest.raises(InvalidValueError, match="milestones"):
        S.SequentialLR([S.LinearLR(BASE)], [3])
    with pytest.raises(InvalidValueError, match="start_factor"):
        S.LinearLR(BASE, start_factor=0.0)


def test_fit_steps_reduce_on_plateau_with_the_eval_loss(tmp_path) -> None:
    from support.runtime_support import classification_data, generate

    from onnxblocks.runtime import ArrayBatches, TrainingSession, fit

    session = TrainingSession(generate(tmp_path / "artifacts", optimizer="sgd"))
    x, y = classification_data(rows=32)
    batches = ArrayBatches((x, y), batch_size=8, shuffle=False)
    plateau = S.ReduceLROnPlateau(0.5, factor=0.5, patience=0, threshold=0.2)
    history = fit(session, batches, epochs=4, eval_data=[(x, y)], scheduler=plateau, progress=False)
    reference = S.ReduceLROnPlateau(0.5, factor=0.5, patience=0, threshold=0.2)
    expected = [0.5]
    for logs in history.epochs[:-1]:
        expected.append(reference.step(logs["eval_loss"]))
    per_epoch = [history.learning_rates[i * 4] for i in range(4)]
    assert_equal(
        np.float32(per_epoch), np.float32(expected), name="rates"
    )  # the session holds float32
    assert min(expected) < 0.5  # the plateau did cut the rate
    with pytest.raises(KeyError, match="val_acc"):
        fit(
            session,
            [(x, y)],
            epochs=1,
            scheduler=S.ReduceLROnPlateau(0.1, monitor="val_acc"),
            progress=False,
        )
