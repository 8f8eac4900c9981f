"""Round time on Flower's deployment engine against the sum of the clients' local training times.

Usage::

    python benchmarks/bench_federated.py                    # 2, 4 and 8 clients, 3 rounds each
    python benchmarks/bench_federated.py --clients 2,4 --rounds 2 --rows 400 --hidden 64,64 --json
    out.json

For each client count N the script starts a real SuperLink and N SuperNodes on 127.0.0.1 with
Flower's own commands (:class:`onnxblocks.federated.deployment.LocalDeployment`), runs onnxblocks'
ServerApp and ClientApp for ``--rounds`` rounds of FedAvg (one local epoch, no client evaluation),
and reads each round's wall time from the run's history (the server's clock, from sending the
global model to aggregating the replies).

The local training time of a client is measured here, in this process, by the very call its
ClientApp makes (:func:`onnxblocks.federated.local.train_client`: open a session on the artifacts,
load the global parameters, one epoch of ``fit``), once per client after a warm-up call.

Columns: clients, round s (median over the rounds after the first, which also starts the
SuperNodes' app processes), sum local s (the N clients' local training, one after another), max
local s (the slowest client: the round's lower bound when clients run in parallel), sum fit s (the
clients' own ``train-seconds`` inside their ClientApps in the run, summed over a round: ``fit``
alone, under the run's contention), overhead s
(round minus max local: Flower's messaging, a ClientApp process per client and round with its
imports, and onnxblocks' validation and aggregation), ratio (round / sum local).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_inputs(
    root: Path, clients: int, rows: int, hidden: tuple[int, ...]
) -> tuple[Path, list[str]]:
    """The demo's spiral MLP as SGD artifacts, and one ``.npz`` of ``rows`` rows per client."""
    from onnxblocks import artifacts, optim
    from onnxblocks.datasets import spirals
    from onnxblocks.demo import build_classifier
    from onnxblocks.losses import CrossEntropyLoss

    model = build_classifier(hidden=hidden, seed=0)
    art = root / "artifacts"
    artifacts.generate_artifacts(
        model,
        requires_grad=[i.name for i in model.graph.initializer],
        loss=CrossEntropyLoss(),
        optimizer=optim.SGD(),
        artifact_directory=art,
        additional_output_names=["logits"],
    )
    x, y = spirals(points_per_class=(clients * rows) // 3 + 1, seed=0)
    files = []
    for k in range(clients):
        path = root / f"client{k}.npz"
        np.savez(path, features=x[k * rows : (k + 1) * rows], labels=y[k * rows : (k + 1) * rows])
        files.append(str(path))
    return art, files


def local_seconds(art: Path, files: list[str], batch_size: int) -> list[float]:
    """Each client's ``train_client`` time (one epoch), after one warm-up call."""
    from onnxblocks.federated.local import train_client
    from onnxblocks.runtime import TrainingSession

    start = TrainingSession(art).parameters(trainable_only=True)
    config = {"local-epochs": 1, "batch-size": batch_size, "lr": 0.05, "shuffle": True}
    train_client(art, files[0], start, config)
    times = []
    for path in files:
        began = time.perf_counter()
        train_client(art, path, start, config)
        times.append(time.perf_counter() - began)
    return times


def round_seconds(
    art: Path, files: list[str], root: Path, rounds: int, batch_size: int
) -> tuple[list[float], list[float], float]:
    """A deployment-engine run: the history's per-round wall times, the per-round sums of the
    clients'
    own ``train-seconds`` (``fit`` inside each ClientApp), and the run's wall time."""
    from onnxblocks.federated.deployment import LocalDeployment, NodeSpec
    from onnxblocks.federated.project import write_app

    config = {
        "artifacts": str(art),
        "num-server-rounds": rounds,
        "min-nodes": len(files),
        "local-epochs": 1,
        "batch-size": batch_size,
        "lr": 0.05,
        "fraction-evaluate": 0.0,
        "save": str(root / "out" / "ckpt"),
        "history": str(root / "out" / "history.json"),
    }
    app = write_app(root / "app", config)
    nodes = [NodeSpec({"data-path": path, "partition-id": i}) for i, path in enumerate(files)]
    with LocalDeployment(nodes, root / "run") as deployment:
        outcome = deployment.run(app, timeout=3600)
    if not outcome.ok:
        raise SystemExit(f"the run failed ({outcome.status}: {outcome.details}); see {outcome.log}")
    history = json.loads((root / "out" / "history.json").read_text())
    fits = [
        sum(
            float(c.get("train-seconds", 0.0))
            for c in history["clients"]
            if c["phase"] == "train" and c["round"] == r
        )
        for r in range(1, rounds + 1)
    ]
    return [float(s) for s in history["seconds"]], fits, outcome.seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clients", default="2,4,8", help="client counts, comma-separated (default 2,4,8)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3)")
    parser.add_argument(
        "--rows", type=int, default=600, help="training rows per client (default 600)"
    )
    parser.add_argument("--batch-size", type=int, default=32, help="client batch size (default 32)")
    parser.add_argument(
        "--hidden", default="64,64", help="hidden layer widths of the MLP (default 64,64)"
    )
    parser.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    hidden = tuple(int(h) for h in args.hidden.split(","))
    print(
        f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, MLP "
        f"2-{args.hidden}-3"
    )
    print(
        f"# {args.rows} rows per client, batch {args.batch_size}, 1 local epoch, {args.rounds} "
        "rounds of FedAvg"
    )
    header = (
        f"{'clients':>7} {'round s':>8} {'sum local s':>11} {'max local s':>11} {'sum fit s':>9} "
        f"{'overhead s':>10} {'ratio':>6}"
    )
    print(header)
    results = []
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="bench-federated-") as tmp:
            root = Path(tmp)
            art, files = make_inputs(root, count, args.rows, hidden)
            local = local_seconds(art, files, args.batch_size)
            rounds, fits, wall = round_seconds(art, files, root, args.rounds, args.batch_size)
        steady = rounds[1:] or rounds
        round_s = statistics.median(steady)
        fit_s = statistics.median(fits[1:] or fits)
        row = {
            "clients": count,
            "round_s": round_s,
            "rounds_s": rounds,
            "run_s": wall,
            "local_s": local,
            "sum_local_s": sum(local),
            "max_local_s": max(local),
            "client_fit_s": fits,
        }
        results.append(row)
        print(
            f"{count:>7} {round_s:>8.2f} {sum(local):>11.3f} {max(local):>11.3f} {fit_s:>9.3f} "
            f"{round_s - max(local):>10.2f} "
            f"{round_s / sum(local):>6.1f}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
