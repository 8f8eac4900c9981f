"""Federations on Flower's simulation runtime (Ray): exactness, convergence, FedProx, FedAdam, DP clipping.

Each test is one simulation run (Ray starts once per run, some seconds on two cores), checked several ways:
in-process with ``flwr.simulation.run_simulation`` (the strategy objects stay inspectable), and the
convergence run end to end with ``flwr run`` against ``flower-superlink --simulation`` (:func:`simulate`).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from support.flower_apps import (
    assert_fedavg,
    client_files,
    non_iid_files,
    sgd_reference,
    simulate,
    spiral_artifacts,
)
from support.numerics import assert_close

from onnxblocks.federated import FederatedHistory, make_client_app, make_server_app
from onnxblocks.federated import simulate as simulate_with_flwr_run
from onnxblocks.runtime import TrainingSession

#: the in-process simulations share one Ray instance (tests/federated/conftest.py)
pytestmark = pytest.mark.usefixtures("one_ray")

SIZES = (20, 30, 40)
LOCAL = {"local_steps": 3, "batch_size": 6, "shuffle": False, "lr": 0.1}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("simulation")
    return root, spiral_artifacts(root), client_files(root, SIZES)


def one_round(root, art, files, name, **settings):
    out = root / name
    server = make_server_app(
        art,
        rounds=1,
        min_nodes=len(files),
        fraction_evaluate=0.0,
        save=str(out / "final.ckpt"),
        history=str(out / "history.json"),
        **LOCAL,
        **settings,
    )
    simulate(server, make_client_app(art, data=files), len(files))
    final = TrainingSession(art, checkpoint=out / "final.ckpt").parameters(trainable_only=True)
    return final, FederatedHistory.load(out / "history.json"), out


def local_results(art, files, mu=0.0):
    start = TrainingSession(art).parameters(trainable_only=True)
    results = []
    for path in files:
        session = TrainingSession(art)
        if mu == 0.0:  # N separate TrainingSessions with their own SGD optimizer model
            session.learning_rate = LOCAL["lr"]
            with np.load(path) as data:
                x, y = data["features"], data["labels"]
            for step in range(LOCAL["local_steps"]):
                rows = slice(step * LOCAL["batch_size"], (step + 1) * LOCAL["batch_size"])
                session.train_step(x[rows], y[rows])
                session.optimizer_step()
            results.append(session.parameters(trainable_only=True))
        else:  # FedProx's update, in NumPy
            results.append(
                sgd_reference(
                    art, path, LOCAL["local_steps"], LOCAL["lr"], LOCAL["batch_size"], mu=mu
                )
            )
    return start, results


def test_one_fedavg_round_is_the_weighted_average_of_separate_sessions(small):
    root, art, files = small
    out = root / "fedavg"
    server = make_server_app(
        art,
        rounds=1,
        min_nodes=3,
        save=str(out / "final.ckpt"),
        export=str(out / "model.onnx"),
        history=str(out / "history.json"),
        plot=str(out / "rounds.svg"),
        eval_data=files[2],
        **LOCAL,
    )
    simulate(server, make_client_app(art, data=files), 3)
    final = TrainingSession(art, checkpoint=out / "final.ckpt")
    _, results = local_results(art, files)
    assert_fedavg(final.parameters(trainable_only=True), results, SIZES)
    # the inference model carries the aggregate
    import onnxruntime

    with np.load(files[2]) as data:
        x, y = data["features"], data["labels"]
    logits = onnxruntime.InferenceSession(str(out / "model.onnx")).run(None, {"features": x})[0]
    assert_close(
        logits, final.eval_step(x, y)[1], rtol=1e-5, name="logits"
    )  # ours both: no float64 truth
    # the history: weighted training loss, per-client replies, evaluation, server evaluation of rounds 0 and 1
    history = FederatedHistory.load(out / "history.json")
    train = [c for c in history.clients if c["phase"] == "train"]
    assert sorted(c["partition"] for c in train) == [0, 1, 2]
    assert sorted(c["num-examples"] for c in train) == list(SIZES)
    loss = sum(c["train-loss"] * c["num-examples"] for c in train) / sum(SIZES)
    ((round_, aggregated),) = history.metric("train-loss")
    assert round_ == 1
    assert_close(np.float64(aggregated), np.float64(loss), rtol=1e-6, name="train-loss")
    assert [r for r, _ in history.metric("accuracy", "server")] == [0, 1]
    assert history.metric("eval-loss", "evaluate")[0][0] == 1 and not history.dropped
    assert json.loads((out / "history.json").read_text())["rounds"] == 1
    assert (out / "rounds.svg").exists() and (out / "rounds-accuracy.svg").exists()


def test_fedprox_round_uses_the_proximal_term(small):
    root, art, files = small
    final, _, _ = one_round(root, art, files, "fedprox", strategy="fedprox", proximal_mu=2.0)
    _, results = local_results(art, files, mu=2.0)
    assert_fedavg(final, results, SIZES)


def test_server_side_dp_clips_each_client_update(small):
    root, art, files = small
    clip = 0.05
    final, history, _ = one_round(
        root, art, files, "dp", dp_clipping_norm=clip, dp_noise_multiplier=0.0
    )
    start, results = local_results(art, files)
    clipped = []
    for result in results:
        update = {k: result[k].astype(np.float64) - start[k] for k in start}
        norm = np.sqrt(sum(float(np.sum(u**2)) for u in update.values()))
        assert norm > clip  # the clipping acts
        clipped.append({k: start[k] + u * min(1.0, clip / norm) for k, u in update.items()})
        clipped_norm = np.sqrt(sum(float(np.sum((clipped[-1][k] - start[k]) ** 2)) for k in start))
        assert_close(np.float64(clipped_norm), np.float64(clip), rtol=1e-6, name="clipped norm")
    assert_fedavg(final, clipped, SIZES)
    norms = sorted(c["update-norm"] for c in history.clients if c["phase"] == "train")
    assert all(
        n > clip for n in norms
    )  # the history holds the norms the clients sent, before clipping


def test_fedadam_runs_drops_a_nan_client_and_keeps_float32_parameters(small):
    root, art, files = small
    out = root / "fedadam"
    out.mkdir()
    with np.load(files[0]) as data:  # a fourth client whose data makes its parameters NaN
        np.savez(
            out / "nan.npz", features=np.full_like(data["features"], np.nan), labels=data["labels"]
        )
    server = make_server_app(
        art,
        rounds=3,
        min_nodes=4,
        fraction_evaluate=0.0,
        strategy="fedadam",
        server_lr=0.05,
        eval_data=files[2],
        save=str(out / "final.ckpt"),
        history=str(out / "history.json"),
        **LOCAL,
    )
    simulate(server, make_client_app(art, data=[*files, str(out / "nan.npz")]), 4)
    history = FederatedHistory.load(out / "history.json")
    assert history.rounds == 3
    assert [(d["round"], d["phase"]) for d in history.dropped] == [
        (1, "train"),
        (2, "train"),
        (3, "train"),
    ]
    assert all("non-finite" in d["reason"] for d in history.dropped)
    assert (
        len([c for c in history.clients if c["phase"] == "train"]) == 9
    )  # the three good clients, each round
    losses = [v for _, v in history.metric("eval-loss", "server")]
    assert losses[-1] < losses[0]
    final = TrainingSession(art, checkpoint=out / "final.ckpt").parameters(trainable_only=True)
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in final.values())


def test_non_iid_spirals_converge_with_fedavg(tmp_path, monkeypatch):
    """Also with this venv's scripts off the PATH (``python -m`` or a notebook kernel in a venv not activated)."""
    scripts = os.path.dirname(sys.executable)
    monkeypatch.setenv(
        "PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != scripts)
    )
    art = spiral_artifacts(tmp_path, hidden=(64, 64), optimizer="adamw")
    files, held_out = non_iid_files(tmp_path, clients=4, major=0.8)
    for path in files:  # each client holds mostly one class
        with np.load(path) as data:
            counts = np.bincount(data["labels"], minlength=3)
        assert counts.max() / counts.sum() > 0.6
    history = simulate_with_flwr_run(  # `flwr run` against a SuperLink in simulation mode: Flower's own commands
        art,
        files,
        workdir=tmp_path / "flower",
        num_cpus=1,  # one Ray actor: a second's start-up (imports) costs more than its clients
        rounds=10,
        local_epochs=2,
        lr=0.01,
        batch_size=32,
        eval_data=held_out,
        history=str(tmp_path / "history.json"),
        plot=str(tmp_path / "rounds.svg"),
    )
    assert (tmp_path / "flower" / "app" / "pyproject.toml").exists()
    history = FederatedHistory.load(tmp_path / "history.json")
    accuracy = history.metric("accuracy", "server")
    assert [r for r, _ in accuracy] == list(range(11))
    assert accuracy[-1][1] >= 0.9, accuracy
    assert len(history.client_metric("train-loss")) == 4
    assert (tmp_path / "rounds.svg").exists() and (tmp_path / "rounds-accuracy.svg").exists()
