"""Helpers of the deployment-engine tests: Flower apps shipped in the app directory, and process checks.

* :data:`ECHO_APP`: a ClientApp that adds its node config's ``value`` to every global array and a
  ServerApp that runs Flower's FedAvg and saves the result (run config ``out``): the deployment
  engine's plumbing checked without onnxblocks' apps.
* :data:`FAULT_APP`: onnxblocks' ClientApp behind a test-only hook, node config ``fault``:
  ``nan`` replies NaN parameters, ``hang`` sleeps (a client that hangs, or one killed mid-round),
  ``crash`` raises.
* :func:`flower_processes`: the living processes whose ``FLWR_HOME`` is a run directory's: every
  process a deployment started, however deep (Flower starts helpers in sessions of their own).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ECHO_APP = """
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    import sys
    import time

    time.sleep(float(context.run_config.get("sleep", 0.0)))
    arrays = msg.content["arrays"].to_numpy_ndarrays()
    value = float(context.node_config["value"])
    content = RecordDict(
        {
            "arrays": ArrayRecord([a + value for a in arrays]),
            "metrics": MetricRecord({"num-examples": int(context.node_config["rows"]), "train-loss": value}),
            "client": ConfigRecord({"python": f"{sys.version_info[0]}.{sys.version_info[1]}"}),
        }
    )
    return Message(content=content, reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    nodes = int(context.run_config["nodes"])
    strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord([np.zeros(3, dtype=np.float32)]),
        num_rounds=int(context.run_config["num-server-rounds"]),
    )
    np.save(context.run_config["out"], result.arrays.to_numpy_ndarrays()[0])
"""

FAULT_APP = """
import time

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.clientapp import ClientApp

from onnxblocks.federated.app import client_app as inner

client_app = ClientApp()


@client_app.train()
def train(msg, context):
    fault = str(context.node_config.get("fault", ""))
    if fault == "hang":
        time.sleep(3600)
    if fault == "crash":
        raise RuntimeError("this client crashes on purpose (fault=crash)")
    reply = inner(msg, context)
    if fault == "nan" and reply.has_content():
        record = reply.content["arrays"]
        arrays = {name: Array(np.full_like(array.numpy(), np.nan)) for name, array in record.items()}
        reply.content["arrays"] = ArrayRecord(arrays)
    return reply


@client_app.evaluate()
def evaluate(msg, context):
    return inner(msg, context)
"""


def flower_processes(run_dir: str | os.PathLike) -> list[str]:
    """``pid cmdline`` of each living process whose ``FLWR_HOME`` lies in ``run_dir`` (Linux ``/proc``)."""
    home = f"FLWR_HOME={Path(run_dir).resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].startswith("Z"):
            continue
        if any(item.startswith(home) for item in environ):
            found.append(f"{entry.name} {cmdline[:200]}")
    return found


def await_flower_processes(
    run_dir: str | os.PathLike, count: int, timeout: float = 120.0
) -> list[str]:
    """:func:`flower_processes` once at least ``count`` live: a SuperNode spawns its SuperExec after it listens,
    and on a loaded machine that can take seconds."""
    deadline = time.monotonic() + timeout
    while len(found := flower_processes(run_dir)) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def kill_flower_processes(run_dir: str | os.PathLike) -> None:
    """SIGKILL every process :func:`flower_processes` finds: a failed test never leaves a federation running."""
    for line in flower_processes(run_dir):
        try:
            os.kill(int(line.split(" ", 1)[0]), signal.SIGKILL)
        except OSError:
            pass
