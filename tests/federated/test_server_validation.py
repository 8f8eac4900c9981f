"""Server-side checks: bad replies are dropped with a reason, the others aggregated by Flower's own strategy."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from support.numerics import assert_close, assert_equal

from onnxblocks.errors import InvalidTypeError, InvalidValueError, UnknownNameError
from onnxblocks.federated import (
    FederatedHistory,
    ServerSettings,
    ValidatingStrategy,
    build_strategy,
    check_arrays,
)
from onnxblocks.federated.records import to_record
from onnxblocks.federated.validation import specs_of

#: Every test here builds messages, stamped as in a real run (``conftest.task_identity``).
pytestmark = pytest.mark.usefixtures("task_identity")


GLOBAL = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def reply(arrays=None, metrics=None, node=1):
    content = RecordDict()
    if arrays is not None:
        content["arrays"] = to_record(arrays)
    content["metrics"] = MetricRecord(
        metrics if metrics is not None else {"num-examples": 10, "train-loss": 0.5}
    )
    content["client"] = ConfigRecord({"partition-id": node})
    return Message(content=content, reply_to=request(node))


def request(node):
    return Message(content=RecordDict(), dst_node_id=node, message_type="train")


def failed(node=9):
    return Message(Error(code=1, reason="ClientApp raised MemoryError"), reply_to=request(node))


def filled(value, **changes):
    out = {k: np.full_like(v, value) for k, v in GLOBAL.items()}
    out.update(changes)
    return out


def strategy():
    history = FederatedHistory()
    wrapped = ValidatingStrategy(
        FedAvg(min_train_nodes=1, min_available_nodes=1), specs_of(GLOBAL), history
    )
    wrapped._global = dict(GLOBAL)
    return wrapped, history


def test_bad_replies_are_dropped_and_the_round_aggregates_the_rest():
    wrapped, history = strategy()
    replies = [
        reply(filled(1.0), {"num-examples": 10, "train-loss": 0.5}, node=0),
        reply(filled(4.0), {"num-examples": 30, "train-loss": 0.7}, node=1),
        reply(filled(1.0, w=np.full((2, 3), np.nan, np.float32)), node=2),
        reply(filled(1.0, w=np.ones((3, 2), np.float32)), node=3),
        reply(filled(1.0, w=np.ones((2, 3), np.float64)), node=4),
        reply({"w": GLOBAL["w"], "bias": GLOBAL["b"]}, node=5),
        reply(filled(1.0), {"num-examples": 0, "train-loss": 0.5}, node=6),
        reply(filled(1.0), {"num-examples": 5, "train-loss": float("inf")}, node=7),
        reply(None, node=8),
        failed(),
    ]
    arrays, metrics = wrapped.aggregate_train(1, replies)
    aggregated = {k: v.numpy() for k, v in arrays.items()}
    # (10 * 1 + 30 * 4) / 40: dyadic, exact in any order
    assert_equal(
        aggregated["w"], np.full((2, 3), (10 * 1.0 + 30 * 4.0) / 40, aggregated["w"].dtype)
    )
    assert_close(
        np.float64(metrics["train-loss"]), np.float64((10 * 0.5 + 30 * 0.7) / 40), rtol=1e-12
    )
    reasons = [d["reason"] for d in history.dropped]
    assert len(reasons) == 8
    for needle in (
        "non-finite",
        "shape (3, 2)",
        "float64",
        "unknown 'bias'",
        "'num-examples' is 0",
        "'train-loss'",
        "0 ArrayRecords",
        "MemoryError",
    ):
        assert any(needle in r for r in reasons), (needle, reasons)
    kept = [c for c in history.clients if c["phase"] == "train"]
    assert [c["partition"] for c in kept] == [0, 1]
    assert kept[1]["update-norm"] == 12.0  # sqrt(9 * 4.0 ** 2): exact
    ((row,),) = [history.train]
    assert sorted(row) == ["round", "train-loss"] and row["round"] == 1
    assert_close(np.float64(row["train-loss"]), np.float64(0.65), rtol=1e-12, name="train-loss")


def test_a_round_without_a_good_reply_keeps_the_global_model():
    wrapped, history = strategy()
    arrays, metrics = wrapped.aggregate_train(2, [failed(), reply(filled(np.inf))])
    assert arrays is None and metrics is None
    assert len(history.dropped) == 2 and history.rounds == 2


def test_a_node_that_never_answers_is_reported():
    history = FederatedHistory()
    wrapped = ValidatingStrategy(
        FedAvg(min_train_nodes=1, min_available_nodes=1), specs_of(GLOBAL), history, timeout=30
    )
    wrapped._global = dict(GLOBAL)
    wrapped._sent("train", [request(node) for node in (11, 12, 13)])
    arrays, _ = wrapped.aggregate_train(1, [reply(filled(2.0), node=11), failed(node=13)])
    assert_equal(
        arrays["w"].numpy(), np.full_like(arrays["w"].numpy(), 2.0)
    )  # one reply: its values
    assert {(d["node"], d["reason"]) for d in history.dropped} == {
        (12, "no reply within the round timeout (30 s)"),
        (13, "the client failed: ClientApp raised MemoryError"),
    }


def test_check_arrays_and_strategy_names():
    assert check_arrays(GLOBAL, specs_of(GLOBAL)) is None
    assert "missing 'b'" in check_arrays({"w": GLOBAL["w"]}, specs_of(GLOBAL))
    assert type(build_strategy("FedProx", proximal_mu=0.1)).__name__ == "FedProx"
    assert type(build_strategy("fedyogi")).__name__ == "FedYogi"
    dp = build_strategy("fedavg", dp_clipping_norm=0.5, min_nodes=3)
    assert (
        type(dp).__name__ == "DifferentialPrivacyServerSideFixedClipping"
        and dp.clipping_norm == 0.5
    )
    with pytest.raises(InvalidValueError, match="fedavg, fedprox"):
        build_strategy("krum")


def test_history_round_trips_and_plots(tmp_path):
    history = FederatedHistory(
        train=[{"round": 1, "train-loss": 1.0}, {"round": 2, "train-loss": 0.5}],
        server=[
            {"round": 0, "eval-loss": 1.2, "accuracy": 0.3},
            {"round": 2, "eval-loss": 0.4, "accuracy": 0.8},
        ],
        clients=[
            {"round": r, "phase": "train", "node": 5, "partition": 0, "train-loss": 1.0 / r}
            for r in (1, 2)
        ],
        rounds=2,
    )
    again = FederatedHistory.load(history.save(tmp_path / "h.json"))
    assert again == history
    assert again.metric("accuracy", "server") == [(0, 0.3), (2, 0.8)]
    assert again.client_metric("train-loss") == {"0": [(1, 1.0), (2, 0.5)]}
    svg = history.plot(tmp_path / "loss.svg").read_text()
    assert "train-loss: client 0" in svg and "server (held out)" in svg
    with pytest.raises(InvalidValueError, match="f1"):
        history.plot(tmp_path / "f1.svg", "f1")


def test_server_settings_from_the_run_config():
    run_config = {
        "artifacts": "art",
        "num-server-rounds": 4,
        "lr": 1,
        "shuffle": "false",
        "data-path-0": "x.npz",
    }
    settings = ServerSettings.from_run_config(run_config, min_nodes=3)
    assert (settings.rounds, settings.lr, settings.shuffle, settings.min_nodes) == (
        4,
        1.0,
        False,
        3,
    )
    assert settings.local_config().to_config() == {
        "local-epochs": 1,
        "lr": 1.0,
        "batch-size": 32,
        "shuffle": False,
        "seed": 0,
        "proximal-mu": 0.0,
    }
    with pytest.raises(InvalidTypeError, match="'num-server-rounds' must be int"):
        ServerSettings.from_run_config({"artifacts": "a", "num-server-rounds": "x"})
    with pytest.raises(InvalidValueError, match="batch-size"):
        ServerSettings.from_run_config({"artifacts": "a", "batch-size": 0})
    with pytest.raises(UnknownNameError, match="artifacts"):
        ServerSettings.from_run_config({})
    with pytest.raises(UnknownNameError, match="Did you mean 'rounds'"):
        ServerSettings.from_run_config({"artifacts": "a"}, round=3)
