"""A federated round's time: Flower's own floor (a no-op ClientApp) against onnxblocks' ClientApp.

For each number of clients N, two federations on Flower's deployment engine on 127.0.0.1
(``LocalDeployment``: a SuperLink and N SuperNodes), R rounds each:

* **floor**: a ClientApp that returns the global arrays unchanged (it imports Flower and numpy
  only) and a ServerApp running Flower's FedAvg one round at a time, timing each round;
* **onnxblocks**: onnxblocks' ClientApp and ServerApp on the spiral MLP 2-16-3 (one local SGD
  step, batch 32; no evaluation), the round times from the history.

Each round's time covers sending the global model, every SuperNode starting a fresh ClientApp
process for the message, the replies and the aggregation. The median of rounds 2..R is reported;
onnxblocks' share is the difference, also per client.

Round times on a shared machine swing with its load, so a second table gives what load hardly
moves: the CPU seconds of one client message as Flower's SuperNode runs it, a fresh process that
imports Flower, loads the ClientApp and handles one ``train`` message (the median of ``--messages``
processes), for the no-op ClientApp and onnxblocks'. The load average is printed with each table.

    python benchmarks/bench_federated_overhead.py --clients 2 4 8 --rounds 3 --messages 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
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


#: One ``train`` message in a fresh process, as ``flwr-clientapp`` handles it: Flower's imports,
#: the ClientApp loaded by its reference, the handler run on the global arrays.
MESSAGE = """
import json
import sys

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp  # noqa: F401  (flwr-clientapp imports it before the app)
from flwr.supercore.object_ref import load_app
from flwr.supercore.task_identity import TaskIdentity

ref, run_config, node_config = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
app = load_app(ref, RuntimeError, sys.argv[5])
TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = 1, 1, 1
arrays = ArrayRecord({k: Array(v) for k, v in np.load(sys.argv[4]).items()})
content = RecordDict({"arrays": arrays, "config": ConfigRecord(run_config)})
context = Context(
    run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config=run_config
)
reply = app(Message(content=content, dst_node_id=1, message_type="train"), context)
assert not reply.has_error(), reply.error
"""


def _message_cpu(root: Path, which: str, count: int) -> float:
    """Median CPU seconds (user + system) of ``count`` fresh processes each handling one message."""
    art, files = _inputs(root, 1)
    app_dir = root / "noop-message"
    app_dir.mkdir(exist_ok=True)
    (app_dir / "noop_app.py").write_text(NOOP_APP)
    arrays = root / "global.npz"
    if not arrays.exists():
        from onnxblocks.runtime import TrainingSession

        np.savez(arrays, **TrainingSession(art).parameters(trainable_only=True))
    config = {"artifacts": str(art), "local-steps": 1, "batch-size": 32, "shuffle": False}
    ref = "noop_app:client_app" if which == "floor" else "onnxblocks.federated.app:client_app"
    args = [ref, json.dumps(config), json.dumps({"data-path": files[0]}), str(arrays), str(app_dir)]
    seconds = []
    for _ in range(count):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", MESSAGE, *args], check=True, cwd=root)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(seconds)


def _byte_compiled(root: Path) -> None:
    """Let every process of the benchmark keep and reuse bytecode, as a pip-installed package
    does: a checkout run with ``PYTHONDONTWRITEBYTECODE`` compiles onnxblocks in every ClientApp
    process, which an installation never does. The bytecode goes to a prefix under ``root``
    (nothing is written into the checkout) and written by a first message of each kind here; the
    federations' first rounds, which compile Flower's server side, are not counted.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    for which in ("floor", "onnxblocks"):  # each process of a kind reads what this one wrote
        _message_cpu(root, which, 1)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="*", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--messages", type=int, default=5, help="fresh processes per CPU figure (0: none)"
    )
    parser.add_argument(
        "--source-only",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE as it is (every process compiles onnxblocks again)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        if not args.source_only:
            _byte_compiled(Path(tmp))
        if args.messages:
            print(f"load average before: {_load()}")
            floor = _message_cpu(Path(tmp), "floor", args.messages)
            ours = _message_cpu(Path(tmp), "onnxblocks", args.messages)
            print("| one client message | no-op ClientApp | onnxblocks' ClientApp | share |")
            print("|---|---:|---:|---:|")
            print(f"| CPU s | {floor:.2f} | {ours:.2f} | {ours - floor:.2f} |", flush=True)
            print(f"load average after: {_load()}\n")
        if args.clients:
            print(f"load average before: {_load()}")
            print(
                "| clients | floor s/round | onnxblocks s/round | onnxblocks' share s/round "
                "| share s/round per client |"
            )
            print("|---:|---:|---:|---:|---:|")
        for nodes in args.clients:
            floor = statistics.median(_run(nodes, args.rounds, Path(tmp), "floor")[1:])
            ours = statistics.median(_run(nodes, args.rounds, Path(tmp), "onnxblocks")[1:])
            share = ours - floor
            print(
                f"| {nodes} | {floor:.2f} | {ours:.2f} | {share:.2f} | {share / nodes:.2f} |",
                flush=True,
            )
        if args.clients:
            print(f"load average after: {_load()}")
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')})")


if __name__ == "__main__":
    main()
