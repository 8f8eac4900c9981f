"""A federated round's time: Flower's own floor (a no-op ClientApp) against onnxblocks' ClientApp.

For each number of clients N, two federations on Flower's deployment engine on 127.0.0.1
(``LocalDeployment``: a SuperLink and N SuperNodes), R rounds each:

* **floor**: a ClientApp that returns the global arrays unchanged (it imports Flower and numpy
  only) and a ServerApp running Flower's FedAvg one round at a time, timing each round;
* **onnxblocks**: onnxblocks' ClientApp and ServerApp on the spiral MLP 2-16-3 (one local SGD
  step, batch 32; no evaluation), the round times from the history.

Each round's time covers sending the global model, every SuperNode starting a fresh ClientApp
process for the message, the replies and the aggregation. The median of rounds 2..R is reported;
onnxblocks' share is the difference.

    python benchmarks/bench_federated_overhead.py --clients 2 4 8 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NOOP_APP = """
import json
import time

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    content = RecordDict(
        {"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})}
    )
    return Message(content=content, reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    nodes = int(context.run_config["nodes"])
    arrays = ArrayRecord([np.zeros((64, 64), np.float32)])
    times = []
    for _ in range(int(context.run_config["num-server-rounds"])):
        strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
        started = time.monotonic()
        arrays = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=1).arrays
        times.append(time.monotonic() - started)
    with open(context.run_config["out"], "w") as f:
        json.dump(times, f)
"""


def _run(nodes: int, rounds: int, root: Path, which: str) -> list[float]:
    from onnxblocks.federated.deployment import LocalDeployment, NodeSpec
    from onnxblocks.federated.project import write_app

    out = root / f"{which}-{nodes}"
    if which == "floor":
        config = {"nodes": nodes, "num-server-rounds": rounds, "out": str(out / "times.json")}
        app = write_app(
            out / "app",
            config,
            server_app="noop_app:server_app",
            client_app="noop_app:client_app",
            modules={"noop_app": NOOP_APP},
        )
        specs = [NodeSpec({"partition-id": i}) for i in range(nodes)]
    else:
        art, files = _inputs(root, nodes)
        config = {
            "artifacts": str(art),
            "num-server-rounds": rounds,
            "local-steps": 1,
            "batch-size": 32,
            "shuffle": False,
            "min-nodes": nodes,
            "fraction-evaluate": 0.0,
            "save": str(out / "ckpt"),
            "history": str(out / "history.json"),
        }
        app = write_app(out / "app", config)
        specs = [NodeSpec({"data-path": f, "partition-id": i}) for i, f in enumerate(files)]
    with LocalDeployment(specs, out / "run") as deployment:
        outcome = deployment.run(app, timeout=3600)
    if not outcome.ok:
        raise SystemExit(f"{which} with {nodes} clients: {outcome.status} ({outcome.details})")
    if which == "floor":
        return list(json.loads((out / "times.json").read_text()))
    return list(json.loads((out / "history.json").read_text())["seconds"])


def _inputs(root: Path, nodes: int) -> tuple[Path, list[str]]:
    from onnxblocks import artifacts, optim
    from onnxblocks.datasets import spirals
    from onnxblocks.demo import build_classifier
    from onnxblocks.losses import CrossEntropyLoss

    art = root / "artifacts"
    if not art.exists():
        model = build_classifier(hidden=(16,), seed=0)
        artifacts.generate_artifacts(
            model,
            requires_grad=[i.name for i in model.graph.initializer],
            loss=CrossEntropyLoss(),
            optimizer=optim.SGD(),
            artifact_directory=art,
        )
    x, y = spirals(points_per_class=100, seed=0)
    files = []
    for i in range(nodes):
        path = root / f"client{i}.npz"
        np.savez(path, features=x[i::nodes], labels=y[i::nodes])
        files.append(str(path))
    return art, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print("| clients | floor s/round | onnxblocks s/round | onnxblocks' share s |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for nodes in args.clients:
            floor = statistics.median(_run(nodes, args.rounds, Path(tmp), "floor")[1:])
            ours = statistics.median(_run(nodes, args.rounds, Path(tmp), "onnxblocks")[1:])
            print(f"| {nodes} | {floor:.2f} | {ours:.2f} | {ours - floor:.2f} |", flush=True)
    print(f"(python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')})")


if __name__ == "__main__":
    main()
