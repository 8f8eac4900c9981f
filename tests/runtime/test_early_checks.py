"""What can be checked before the first step is checked before it, in the API (the CLI: tests/cli).

A checkpoint template that cannot be filled in, a checkpoint path that cannot be
written, a class label out of range in the last batch, a learning rate a schedule
would make non-finite: each is refused before any parameter changes, naming the
argument, instead of after one or more batches of training.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.runtime_support import classification_data, generate

from onnxblocks.errors import InvalidValueError, NotAFolderError
from onnxblocks.runtime import ArrayBatches, SaveCheckpoint, TrainingSession, fit
from onnxblocks.runtime.schedules.warmup import StepSchedule


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("art"))


@pytest.mark.parametrize("template", ["ck-{nope}", "ck-{step", "ck-{0}", "ck-{epoch.x}"])
def test_a_checkpoint_template_that_cannot_be_filled_in_is_refused_at_once(tmp_path, template):
    with pytest.raises(
        InvalidValueError, match=r"SaveCheckpoint: the path template .* cannot be filled in"
    ) as info:
        SaveCheckpoint(tmp_path / template)
    assert template in str(info.value)
    assert (
        SaveCheckpoint(tmp_path / "ck-{step}-{epoch}-{{literal}}")._target(3, 2).name
        == "ck-3-2-{literal}"
    )


def _untouched(session: TrainingSession, before: dict) -> None:
    assert session.step == 0
    for name, value in session.parameters().items():
        np.testing.assert_array_equal(value, before[name])


def test_a_checkpoint_path_that_cannot_be_written_stops_fit_before_the_first_step(art, tmp_path):
    (tmp_path / "file").write_bytes(b"")
    session = TrainingSession(art)
    before = session.parameters()
    x, y = classification_data(64)
    with pytest.raises(NotAFolderError, match="SaveCheckpoint: path"):
        fit(
            session,
            ArrayBatches((x, y), 16),
            callbacks=[SaveCheckpoint(tmp_path / "file" / "ck-{epoch}")],
        )
    _untouched(session, before)


def test_a_label_out_of_range_in_the_last_batch_stops_fit_before_the_first_step(art):
    session = TrainingSession(art)
    before = session.parameters()
    x, y = classification_data(64)
    y[-1] = 3  # 3 classes: [0, 3)
    with pytest.raises(
        InvalidValueError, match=r"fit: train_data: input 'labels' holds 3 at position \(63,\)"
    ):
        fit(session, ArrayBatches((x, y), 16, shuffle=False))
    _untouched(session, before)


def test_a_schedule_cannot_hand_onnx_runtime_a_learning_rate_the_setter_refuses():
    schedule = StepSchedule(1.0, step_size=1, gamma=1e10)
    assert schedule(3) == 1e30
    with pytest.raises(InvalidValueError, match=r"StepSchedule\(5\) .*float32"):
        schedule(5)
    with pytest.raises(InvalidValueError, match="base_lr"):
        StepSchedule(float("nan"), step_size=1)
