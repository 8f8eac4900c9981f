"""Optimizer state kept across rounds (opt-in ``keep-optimizer-state``), on both backends.

With the key, each node keeps its AdamW moments and step counts in Flower's per-node ``Context.state``
and restores them before training. Two rounds in which the server hands a client back its own
parameters are then one ``TrainingSession`` trained continuously over the same batches (rtol 1e-5).
Without it (the default), every round starts from fresh optimizer state, as before.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from support.flower_apps import client_files, simulate, spiral_artifacts
from support.numerics import assert_close, is_close

from onnxblocks.errors import InvalidTypeError, InvalidValueError
from onnxblocks.federated import make_client_app, make_server_app, train_client
from onnxblocks.federated import optimizer_state as kept_module
from onnxblocks.federated.client import STATE_ARRAYS, STATE_SCALARS, keeps_optimizer_state
from onnxblocks.federated.optimizer_state import KeptOptimizerState as OptimizerState
from onnxblocks.federated.optimizer_state import read_optimizer_state, write_optimizer_state
from onnxblocks.federated.records import from_record, to_record
from onnxblocks.runtime import TrainingSession

ROWS, BATCH, LR = 12, 4, 0.01  # three AdamW steps per round
CONFIG = {"local-epochs": 1, "batch-size": BATCH, "shuffle": False, "lr": LR}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizer_state")
    arts = {
        "training": spiral_artifacts(root, optimizer="adamw"),
        "portable": spiral_artifacts(root, optimizer="adamw", portable=True),
    }
    return root, arts, client_files(root, (ROWS,))[0]


def continuous(art, path, epochs):
    """One session, ``epochs`` passes over the file in order: the reference of kept state."""
    session = TrainingSession(art)
    session.learning_rate = LR
    with np.load(path) as data:
        x, y = data["features"], data["labels"]
    for _ in range(epochs):
        for start in range(0, len(x), BATCH):
            session.train_step(x[start : start + BATCH], y[start : start + BATCH])
            session.optimizer_step()
    return session.parameters(trainable_only=True)


def close(actual, expected):
    """Two runs of ours (no float64 truth): rtol 1e-5, the floor from each parameter's size."""
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert_close(actual[name], value, rtol=1e-5, name=name)


@pytest.mark.parametrize("backend", ["training", "portable"])
def test_two_rounds_with_kept_state_are_one_continuous_session(setup, backend):
    _, arts, path = setup
    art = arts[backend]
    start = TrainingSession(art).parameters(trainable_only=True)
    one = train_client(art, path, start, CONFIG, keep_optimizer_state=True)
    state = one.optimizer_state
    assert one.backend == backend and state is not None
    assert sorted(state.moments) == sorted(
        f"optimizer/{p}/momentum{i}" for p in start for i in (0, 1)
    )
    assert (state.step, state.session_step) == (3, 3)
    assert any(np.abs(m).max() > 0 for m in state.moments.values())
    two = train_client(
        art, path, one.parameters, CONFIG, optimizer_state=state, keep_optimizer_state=True
    )
    close(two.parameters, continuous(art, path, epochs=2))
    assert (two.optimizer_state.step, two.optimizer_state.session_step) == (6, 6)
    # the default: the second round's optimizer starts fresh, which is not the continuous run
    fresh = train_client(art, path, one.parameters, CONFIG)
    assert fresh.optimizer_state is None
    assert not all(is_close(fresh.parameters[n], two.parameters[n], rtol=1e-3) for n in start)


def test_the_client_app_keeps_state_in_the_nodes_context(setup, task_identity):
    _, arts, path = setup
    art = arts["training"]
    start = TrainingSession(art).parameters(trainable_only=True)

    def two_rounds(app, run_config):
        context = Context(
            run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config=run_config
        )
        params = start
        for _ in range(2):  # the server hands the client its own parameters back (1 client, FedAvg)
            content = RecordDict({"arrays": to_record(params), "config": ConfigRecord(CONFIG)})
            reply = app(Message(content=content, dst_node_id=5, message_type="train"), context)
            assert not reply.has_error(), reply.error
            assert list(reply.content.array_records) == [
                "arrays"
            ]  # the optimizer state never travels
            params = from_record(reply.content["arrays"])
        return params, context

    kept, context = two_rounds(make_client_app(art, data=path), {"keep-optimizer-state": True})
    close(kept, continuous(art, path, epochs=2))
    assert context.state[STATE_SCALARS]["step"] == 6
    assert sorted(context.state[STATE_ARRAYS].keys()) == sorted(
        f"optimizer/{p}/momentum{i}" for p in start for i in (0, 1)
    )
    fresh, context = two_rounds(make_client_app(art, data=path), {})
    assert STATE_ARRAYS not in context.state
    first = train_client(art, path, start, CONFIG)
    close(fresh, train_client(art, path, first.parameters, CONFIG).parameters)
    same, _ = two_rounds(
        make_client_app(art, data=path, keep_optimizer_state=True),
        {"keep-optimizer-state": "false"},
    )
    close(same, kept)  # the factory's argument wins over the run config


def test_kept_state_is_checked_against_the_artifacts(setup):
    _, arts, _ = setup
    session = TrainingSession(arts["training"])
    state = read_optimizer_state(session)
    assert (state.step, state.session_step) == (0, 0)
    name = next(iter(state.moments))
    wrong = OptimizerState({**state.moments, name: np.zeros((1, 1), np.float32)}, step=1)
    with pytest.raises(InvalidValueError, match="is float32 \\(1, 1\\)"):
        write_optimizer_state(session, wrong)
    with pytest.raises(InvalidValueError, match="optimizer/<trainable parameter>/momentum<i>"):
        write_optimizer_state(
            session, OptimizerState({"optimizer/nope/momentum0": np.zeros(1, np.float32)})
        )
    with pytest.raises(InvalidValueError, match="lacks a slot"):
        write_optimizer_state(
            session,
            OptimizerState({k: v for k, v in state.moments.items() if "momentum0" not in k}),
        )
    with pytest.raises(InvalidValueError, match="scalars"):
        OptimizerState.from_parts(state.moments, {"step": -1})
    assert keeps_optimizer_state(None, {"keep-optimizer-state": "TRUE"}) is True
    assert keeps_optimizer_state(None, {}) is False
    with pytest.raises(InvalidTypeError, match="keep-optimizer-state"):
        keeps_optimizer_state(None, {"keep-optimizer-state": 1})


def test_the_old_class_name_is_an_alias_that_warns():
    """``OptimizerState`` is the checkpoint's typed state; here it is a deprecated alias."""
    with pytest.warns(DeprecationWarning, match="KeptOptimizerState"):
        old = kept_module.OptimizerState
    assert old is kept_module.KeptOptimizerState
    with pytest.raises(AttributeError, match="OptimizerStat"):
        kept_module.OptimizerStat  # noqa: B018 - the read is the test


def test_simulated_rounds_keep_the_optimizer_state(setup):
    """Flower's simulation runtime keeps each node's Context between rounds: 1 client, FedAvg, 2 rounds.

    (The default, fresh state every round, is the simulation tests' of test_simulation.py and the
    in-process ClientApp test above: one Ray start less.)
    """
    root, arts, path = setup
    art = arts["training"]
    out = root / "simulated"
    server = make_server_app(
        art,
        rounds=2,
        min_nodes=1,
        fraction_evaluate=0.0,
        local_epochs=1,
        batch_size=BATCH,
        shuffle=False,
        lr=LR,
        save=str(out / "final.ckpt"),
    )
    simulate(server, make_client_app(art, data=[path], keep_optimizer_state=True), 1)
    final = TrainingSession(art, checkpoint=out / "final.ckpt").parameters(trainable_only=True)
    close(final, continuous(art, path, epochs=2))
    start = TrainingSession(art).parameters(trainable_only=True)
    fresh = train_client(
        art, path, train_client(art, path, start, CONFIG).parameters, CONFIG
    ).parameters
    assert not all(
        is_close(final[n], fresh[n], rtol=1e-3) for n in start
    )  # it is not the default's result
