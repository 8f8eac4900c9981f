"""Small federations for the tests of ``onnxblocks.federated``: spiral artifacts, client data, a simulation run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from onnxblocks import artifacts, optim
from onnxblocks.datasets import spirals, train_val_split
from onnxblocks.demo import build_classifier
from onnxblocks.losses import CrossEntropyLoss
from support.numerics import assert_close


def spiral_artifacts(
    root: Path, hidden: tuple[int, ...] = (16,), optimizer: str = "sgd", **options: Any
) -> Path:
    """Artifacts of the demo's spiral MLP (cross entropy, ``logits`` as extra output), with SGD or AdamW."""
    model = build_classifier(hidden=hidden, seed=0)
    params = [i.name for i in model.graph.initializer]
    opt = optim.SGD() if optimizer == "sgd" else optim.AdamW(weight_decay=0.0)
    out = (
        root
        / f"artifacts-{optimizer}-{'x'.join(map(str, hidden))}{'-portable' if options.get('portable') else ''}"
    )
    artifacts.generate_artifacts(
        model,
        requires_grad=params,
        loss=CrossEntropyLoss(),
        optimizer=opt,
        artifact_directory=out,
        additional_output_names=["logits"],
        **options,
    )
    return out


def client_files(root: Path, sizes: tuple[int, ...] = (20, 30, 40), seed: int = 0) -> list[str]:
    """One ``.npz`` per client (``features``, ``labels``), of the given numbers of rows."""
    x, y = spirals(points_per_class=sum(sizes), seed=seed)
    paths, start = [], 0
    for k, size in enumerate(sizes):
        path = root / f"client{k}.npz"
        np.savez(path, features=x[start : start + size], labels=y[start : start + size])
        paths.append(str(path))
        start += size
    return paths


def non_iid_files(
    root: Path, clients: int = 4, major: float = 0.8, seed: int = 0
) -> tuple[list[str], str]:
    """Spirals split over ``clients`` clients, client k holding mostly class ``k % 3``; and a held-out ``.npz``."""
    x, y = spirals(points_per_class=400, seed=seed)
    (xt, yt), (xv, yv) = train_val_split(x, y, 0.2)
    rng = np.random.default_rng(seed)
    owner = np.empty(len(yt), np.int64)
    for i, label in enumerate(yt):
        mains = [k for k in range(clients) if k % 3 == label]
        others = [k for k in range(clients) if k not in mains]
        owner[i] = rng.choice(mains) if rng.random() < major else rng.choice(others)
    paths = []
    for k in range(clients):
        path = root / f"noniid{k}.npz"
        np.savez(path, features=xt[owner == k], labels=yt[owner == k])
        paths.append(str(path))
    held_out = root / "held_out.npz"
    np.savez(held_out, features=xv, labels=yv)
    return paths, str(held_out)


def simulate(server_app: Any, client_app: Any, nodes: int) -> None:
    """Run a federation on Flower's simulation runtime (Ray), the clients in turn on one actor.

    Flower builds one actor per CPU Ray is given, and each actor is a process that imports Flower,
    onnxblocks and ONNX Runtime (about 3.5 s of CPU) before its first message. The tests' clients
    train a few steps each, so on the suite's two busy cores a second actor only adds that start-up;
    one actor runs every node's ClientApp in turn, with each node's own Context, as two would.
    """
    from flwr.simulation import run_simulation

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=nodes,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {
                "num_cpus": 1,
                # Ray starts idle workers ahead of tasks; the one actor starts its own
                "_system_config": {
                    "enable_worker_prestart": False,
                    "prestart_worker_first_driver": False,
                },
            },
        },
    )


def session_steps(
    artifacts_dir: Path,
    path: str,
    steps: int,
    lr: float,
    batch_size: int,
    backend: str | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """One fresh ``TrainingSession``'s ``steps`` steps (its own optimizer) on batches in file order.

    Returns:
        The trainable parameters after them, and the rows of the client's file (its FedAvg weight).
    """
    from onnxblocks.runtime import TrainingSession

    session = (
        TrainingSession(artifacts_dir, backend=backend)
        if backend
        else TrainingSession(artifacts_dir)
    )
    session.learning_rate = lr
    with np.load(path) as data:  # the spiral files' names, or numpy.savez's positional ones
        x, y = (
            data[k] for k in (("features", "labels") if "features" in data else ("arr_0", "arr_1"))
        )
    for step in range(steps):
        rows = slice(step * batch_size, (step + 1) * batch_size)
        session.train_step(x[rows], y[rows])
        session.optimizer_step()
    return session.parameters(trainable_only=True), len(x)


def sgd_reference(
    artifacts_dir: Path,
    path: str,
    steps: int,
    lr: float,
    batch_size: int,
    start: dict[str, np.ndarray] | None = None,
    mu: float = 0.0,
) -> dict[str, np.ndarray]:
    """``steps`` SGD steps on batches in file order, computed in NumPy from the model's raw gradients.

    The gradient of each step comes from a plain ``train_step`` at the current parameters; the update
    ``w -= lr * (g + mu * (w - start))`` (FedProx when ``mu > 0``) is NumPy's, not the optimizer model's.
    """
    from onnxblocks.runtime import TrainingSession

    session = TrainingSession(artifacts_dir)
    if start is not None:
        session.set_parameters(start)
    anchor = {k: v.astype(np.float64) for k, v in session.parameters(trainable_only=True).items()}
    with np.load(path) as data:
        x, y = data["features"], data["labels"]
    assert steps * batch_size <= len(x), "the reference takes batches without wrapping around"
    for step in range(steps):
        rows = slice(step * batch_size, (step + 1) * batch_size)
        session.lazy_reset_grad()
        session.train_step(x[rows], y[rows])
        weights = session.parameters(trainable_only=True)
        new = {}
        for name, grad in session.gradients().items():
            w = weights[name].astype(np.float64)
            new[name] = (w - lr * (grad + mu * (w - anchor[name]))).astype(np.float32)
        session.set_parameters(new)
    return session.parameters(trainable_only=True)


def assert_steps_from(
    start: dict[str, np.ndarray], got: dict[str, np.ndarray], expected: dict[str, np.ndarray]
) -> None:
    """Parameters after local steps against a reference of ours (no float64 truth), by ``support.numerics``.

    rtol 1e-5; the floor from each element's operands, ``|start| + |expected - start|`` (where it started and
    how far the steps took it).
    """
    for name, value in expected.items():
        scale = np.abs(start[name]) + np.abs(np.subtract(value, start[name], dtype=np.float64))
        assert_close(got[name], value, rtol=1e-5, scale=scale, name=name)


def weighted_average(
    results: list[dict[str, np.ndarray]], rows: list[int] | tuple[int, ...]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """FedAvg's row-weighted average of each parameter, in float64, and the same average of the |values| (the
    sum of |terms|: the floor's scale in ``support.numerics``)."""
    total = sum(rows)
    average = {
        k: sum(r[k].astype(np.float64) * n for r, n in zip(results, rows, strict=True)) / total
        for k in results[0]
    }
    magnitude = {
        k: sum(np.abs(r[k].astype(np.float64)) * n for r, n in zip(results, rows, strict=True))
        / total
        for k in results[0]
    }
    return average, magnitude


def assert_fedavg(final: dict[str, np.ndarray], results, rows, rtol: float = 1e-5) -> None:
    """The aggregate against the row-weighted average of the clients' results (ours: no float64 truth)."""
    average, magnitude = weighted_average(results, rows)
    assert sorted(final) == sorted(average)
    for name, value in final.items():
        assert_close(value, average[name], rtol=rtol, scale=magnitude[name], name=name)
