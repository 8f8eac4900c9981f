"""OptimizerState: a checkpoint's optimizer groups as one typed value.

The cases: which group a session resumes from (``group0``, else the first, else none),
reading moments by parameter and slot (index or ``momentum<k>``), the dict form it
replaces (read and written), the checks on what it is built from, and a round trip
through a checkpoint file byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnxblocks.checkpoint import (
    OptimizerGroup,
    OptimizerState,
    load_checkpoint,
    save_checkpoint,
)
from onnxblocks.errors import InvalidTypeError, InvalidValueError, UnknownNameError

W = np.arange(6, dtype=np.float32).reshape(2, 3)
M1, M2 = W + 1, W * W


def _group(name: str, step: int = 3, lr: float = 0.5) -> OptimizerGroup:
    return OptimizerGroup(name, step, lr, {"w": [M1, M2]})


def test_the_resumed_group_is_group0_else_the_first_else_none():
    assert OptimizerState((_group("a"), _group("group0", step=7))).primary.name == "group0"
    assert OptimizerState((_group("b"), _group("a"))).primary.name == "b"
    empty = OptimizerState()
    assert empty.primary is None and not empty and len(empty) == 0
    assert (empty.step, empty.initial_learning_rate, empty.slots("w")) == (0, None, ())


def test_moments_are_read_by_parameter_and_slot():
    state = OptimizerState.single(4, 0.25, {"w": [M1, M2]})
    assert (state.step, state.initial_learning_rate) == (4, 0.25)
    assert state.group_of("w") is state.primary
    np.testing.assert_array_equal(state.moment("w", 0), M1)
    np.testing.assert_array_equal(state.moment("w", "momentum1"), M2)
    assert state.primary.slot_names("w") == ("momentum0", "momentum1")
    assert state.slots("v") == ()
    for slot in (2, "momentum2", True, "exp_avg"):
        with pytest.raises(UnknownNameError, match="holds no slot"):
            state.moment("w", slot)


def test_the_dict_form_reads_and_converts():
    state = OptimizerState.of({"group0": {"step": 2, "initial_learning_rate": 1e-3, "moments": {}}})
    assert list(state) == ["group0"] and state["group0"]["step"] == 2
    assert (
        state["group0"]["initial_learning_rate"] == 1e-3 and dict(state["group0"]["moments"]) == {}
    )
    assert OptimizerState.of(state) is state
    assert OptimizerState() == {}
    with pytest.raises(UnknownNameError, match="no group 'group1'"):
        state["group1"]
    with pytest.raises(UnknownNameError, match="no field 'lr'"):
        state["group0"]["lr"]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ([], InvalidTypeError, "must be an OptimizerState or a mapping"),
        ({"group0": {"step": 1}}, InvalidValueError, "lacks"),
        (
            {"g": {"step": -1, "initial_learning_rate": 0.1, "moments": {}}},
            InvalidValueError,
            "step",
        ),
        (
            {"g": {"step": 1, "initial_learning_rate": 1e40, "moments": {}}},
            InvalidValueError,
            "float32",
        ),
        (
            {"g": {"step": 1, "initial_learning_rate": 0.1, "moments": {"w": M1}}},
            InvalidTypeError,
            "slot order",
        ),
    ],
)
def test_what_it_is_built_from_is_checked(value, error, match):
    with pytest.raises(error, match=match):
        OptimizerState.of(value)


def test_group_names_are_unique():
    with pytest.raises(InvalidValueError, match="more than once"):
        OptimizerState((_group("g"), _group("g")))


def test_it_round_trips_through_a_checkpoint(tmp_path):
    state = OptimizerState((_group("group0", step=9, lr=0.5),))
    path = save_checkpoint(({"w": W}, {}), tmp_path / "ck", optimizer_state=state)
    back = load_checkpoint(path).optimizer_state
    assert back == state
    again = save_checkpoint(({"w": W}, {}), tmp_path / "again", optimizer_state=back)
    assert again.read_bytes() == path.read_bytes()
