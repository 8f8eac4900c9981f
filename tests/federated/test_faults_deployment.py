"""Clients that fail, on the deployment engine: the round completes with the others and the run reports each.

One deployment, one round, five SuperNodes: two healthy clients, one replying NaN parameters, one that
hangs, and one whose ClientApp process is killed in the middle of the round (SIGKILL while it
trains). The hooks are a test-only ClientApp shipped in the Flower app directory
(:data:`support.federation.FAULT_APP`, node config ``fault``) around onnxblocks' own. The server
drops the NaN reply on validation and the two silent clients when it stops waiting for them (the
straggler timeout after the round's first reply; the round timeout bounds it), logs why, records
it in the history, and aggregates the two healthy replies: the result is their row-weighted average,
and no global parameter is ever non-finite.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
from support.federation import FAULT_APP, flower_processes
from support.flower_apps import assert_fedavg, client_files, session_steps, spiral_artifacts

from onnxblocks.federated.deployment import LocalDeployment, NodeSpec
from onnxblocks.federated.project import write_app
from onnxblocks.runtime import TrainingSession

STEPS, BATCH, LR = 2, 6, 0.1
#: Seconds a round waits for replies: well above a healthy client's round on a loaded 2-core machine.
ROUND_TIMEOUT = 60.0
#: Seconds the round still waits once its first reply came: the healthy clients start together, so
#: their replies come within seconds of each other (20 s leaves room for a loaded machine); the two
#: silent ones are dropped at its end.
STRAGGLER_TIMEOUT = 20.0


def test_a_nan_client_a_hanging_client_and_a_killed_client_are_dropped_and_reported(tmp_path):
    art = spiral_artifacts(tmp_path)
    files = client_files(tmp_path, sizes=(20, 30, 24))
    out = tmp_path / "out"
    config = {
        "artifacts": str(art),
        "num-server-rounds": 1,
        "min-nodes": 5,
        "round-timeout": ROUND_TIMEOUT,
        "straggler-timeout": STRAGGLER_TIMEOUT,
        "local-steps": STEPS,
        "batch-size": BATCH,
        "lr": LR,
        "shuffle": False,
        "fraction-evaluate": 0.0,
        "save": str(out / "ckpt"),
        "history": str(out / "history.json"),
    }
    app = write_app(
        out / "app", config, client_app="faults:client_app", modules={"faults": FAULT_APP}
    )
    faults = ["", "", "nan", "hang", "killed"]
    nodes = [
        NodeSpec(
            {
                "data-path": files[min(i, 2)],
                "partition-id": i,
                "fault": "hang" if f == "killed" else f,
            }
        )
        for i, f in enumerate(faults)
    ]
    killed: list[int] = []
    with LocalDeployment(nodes, out / "run") as deployment:

        def kill_mid_round() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not killed:
                pids = deployment.client_app_pids(4)
                if pids:
                    time.sleep(3)  # it is in its round (the hook sleeps)
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    killed.extend(pids)
                time.sleep(0.2)

        killer = threading.Thread(target=kill_mid_round, daemon=True)
        killer.start()
        outcome = deployment.run(app, timeout=600)
        killer.join(timeout=5)
    assert killed, "the ClientApp of node 4 never started"
    assert outcome.ok, (outcome.status, outcome.details)
    history = json.loads((out / "history.json").read_text())
    kept = sorted(c["partition"] for c in history["clients"] if c["phase"] == "train")
    assert kept == [0, 1]
    reasons = [d["reason"] for d in history["dropped"] if d["round"] == 1 and d["phase"] == "train"]
    assert len(reasons) == 3, history["dropped"]
    assert sum("non-finite" in r for r in reasons) == 1
    assert sum("no reply" in r for r in reasons) == 2
    log = outcome.log.read_text()
    assert log.count("dropped the train reply") + log.count("no reply") >= 3
    final = TrainingSession(art, checkpoint=out / "ckpt").parameters(trainable_only=True)
    (a, ra), (b, rb) = (session_steps(art, f, STEPS, LR, BATCH) for f in files[:2])
    for name, value in final.items():
        assert np.isfinite(value).all(), name
    assert_fedavg(final, [a, b], [ra, rb])
    assert flower_processes(out / "run") == []
