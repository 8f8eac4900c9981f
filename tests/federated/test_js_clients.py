"""Node clients beside a Python client in one federation on Flower's deployment engine (``onnxblocks federate``).

One FedAvg round: a Python client and two Node clients (``onnxblocks-train --federate``, each behind
a bridge SuperNode) take 3 SGD steps on their files in file order from the artifacts' parameters;
the global parameters equal the row-weighted average of 3 separate ``TrainingSession``s taking
the same steps (rtol 1e-5: onnxruntime-node's fused step against ONNX Runtime in Python, both
float32). A third Node client, whose data holds NaN, trains NaN parameters: the relay refuses its
state file, the bridge answers Flower with the reason, the server drops it, and the round
completes with the others, every global parameter finite. The history names each client's kind.

Needs Node and the client's npm packages (tests/support/web_support.py, cached); fails, never
skips, without them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import web_support
from support.federation import flower_processes
from support.flower_apps import client_files, session_steps, spiral_artifacts
from support.numerics import assert_close, is_close

from onnxblocks.cli import main
from onnxblocks.runtime import TrainingSession
from onnxblocks.web import write_state

STEPS, BATCH, LR = 3, 6, 0.1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("js-clients")
    art = spiral_artifacts(root, portable=True)
    write_state(art)  # params.safetensors, the JavaScript client's start
    files = client_files(root)
    with np.load(files[2]) as data:
        features = data["features"].copy()
        labels = data["labels"]
    features[::2] = np.nan
    poisoned = root / "poisoned.npz"
    np.savez(poisoned, features=features, labels=labels)
    return art, files, str(poisoned), root


def test_node_and_python_clients_average_like_separate_sessions_and_nan_is_dropped(
    setup, capsys, monkeypatch
):
    art, files, poisoned, root = setup
    cache = web_support.node_modules().parents[1]  # <cache>/npm-<hash>/node_modules
    monkeypatch.setenv(
        "ONNXBLOCKS_CACHE", str(cache)
    )  # the CLI's Node clients use the same install
    out = root / "run"
    argv = [
        "federate",
        str(art),
        "--client-data",
        files[0],
        "--node-client",
        files[1],
        "--node-client",
        files[2],
        "--node-client",
        poisoned,
        "--rounds=1",
        f"--local-steps={STEPS}",
        f"--batch-size={BATCH}",
        f"--lr={LR}",
        "--no-shuffle",
        "--fraction-evaluate=0",
        "--round-timeout=240",
        f"--save={out / 'ckpt'}",
        f"--history={out / 'history.json'}",
        f"--run-dir={out / 'run'}",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    final = TrainingSession(art, checkpoint=out / "ckpt").parameters(trainable_only=True)
    initial = TrainingSession(art).parameters(trainable_only=True)
    total: dict[str, np.ndarray] = {}
    terms: dict[str, np.ndarray] = {}
    rows_all = 0
    for path in files:
        params, rows = session_steps(art, path, STEPS, LR, BATCH)
        for name, value in params.items():
            total[name] = total.get(name, 0.0) + rows * value.astype(np.float64)
            terms[name] = terms.get(name, 0.0) + rows * np.abs(value.astype(np.float64))
        rows_all += rows
    assert sorted(final) == sorted(total)
    for name, value in total.items():
        assert np.isfinite(final[name]).all(), name
        # the sessions are float32 too: no float64 truth, the average computed in float64
        assert_close(
            final[name], value / rows_all, rtol=1e-5, scale=terms[name] / rows_all, name=name
        )
        assert not is_close(final[name], initial[name], rtol=1e-5), name  # the round moved it
    history = json.loads((out / "history.json").read_text())
    kept = sorted(
        (c["partition"], c["kind"], c["num-examples"])
        for c in history["clients"]
        if c["phase"] == "train"
    )
    assert kept == [(0, "python", 20), (1, "node", 30), (2, "node", 40)]
    assert [(d["round"], d["phase"]) for d in history["dropped"]] == [(1, "train")]
    reason = history["dropped"][0]["reason"]
    assert "the client failed" in reason and "not a finite number" in reason, reason
    assert flower_processes(out / "run") == []
    logs = sorted((out / "run" / "logs").glob("node-client-*.log"))
    assert len(logs) == 3
    for log in logs:  # every Node client heard the end and exited
        assert json.loads(log.read_text().splitlines()[-1])["rounds"] in (0, 1)
