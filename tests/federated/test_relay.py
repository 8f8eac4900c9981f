"""The relay between bridge ClientApps and JavaScript clients, without Flower or Node.

A bridge's request (``POST /slots/<k>/run``) is made here as the bridge ClientApp makes it, and the
JavaScript client is played by urllib: what it posts back is checked as the server checks a
reply (each bad result refused with its reason, the good one relayed unchanged), and a client
that stops beating, or never comes, fails the round with a reason.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from onnxblocks.federated.records import arrays_to_npz, npz_to_arrays
from onnxblocks.federated.relay import STATE_FORMAT, Relay
from onnxblocks.safetensors import read_safetensors, write_safetensors

GLOBAL = {
    "w": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.zeros(3, np.float32),
}
METRICS = {"num-examples": 12, "train-loss": 0.5, "steps": 3, "train-seconds": 0.01}


@pytest.fixture
def relay(tmp_path):
    files = {"step_model.onnx": tmp_path / "step.onnx"}
    files["step_model.onnx"].write_bytes(b"model")
    with Relay(["node", "browser"], files, tmp_path / "work", heartbeat_timeout=1.5) as served:
        yield served


def _request(url, data=None, headers=None, timeout=30.0):
    request = urllib.request.Request(
        url, data=data, method="POST" if data is not None else "GET", headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def _bridge(relay, k, phase="train", timeout=20.0):
    """Run the bridge's request in a thread; the thread and where its answer lands."""
    answer: dict = {}
    headers = {
        "X-Phase": phase,
        "X-Round": "1",
        "X-Config": json.dumps({"lr": 0.1}),
        "X-Timeout": str(timeout),
    }

    def run():
        answer["code"], answer["body"], answer["headers"] = _request(
            f"{relay.slot_url(k)}/run", arrays_to_npz(GLOBAL), headers, timeout + 30
        )

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answer


def _take(relay, k):
    """The client's side: take the slot's task and its state file."""
    for _ in range(20):
        _, body, _ = _request(f"{relay.slot_url(k)}/task")
        task = json.loads(body)
        if task["status"] == "task":
            break
    code, state, _ = _request(f"{relay.slot_url(k)}/tasks/{task['id']}/state")
    assert code == 200
    return task, state


def _state_file(tmp_path: Path, arrays, fmt=STATE_FORMAT) -> bytes:
    path = tmp_path / "posted.safetensors"
    write_safetensors(path, arrays, {"format": fmt, "trainable": json.dumps(list(arrays))})
    return path.read_bytes()


def test_the_client_gets_the_global_parameters_and_its_result_is_relayed(relay, tmp_path):
    thread, answer = _bridge(relay, 0)
    task, state = _take(relay, 0)
    assert task["phase"] == "train" and task["config"] == {"lr": 0.1}
    (tmp_path / "task.safetensors").write_bytes(state)
    tensors, metadata = read_safetensors(tmp_path / "task.safetensors")
    assert metadata["format"] == STATE_FORMAT and json.loads(metadata["trainable"]) == ["w", "b"]
    for name, value in GLOBAL.items():
        assert tensors[name].dtype == value.dtype and np.array_equal(tensors[name], value)
    trained = {name: value + 1 for name, value in GLOBAL.items()}
    code, body, _ = _request(
        f"{relay.slot_url(0)}/tasks/{task['id']}/result",
        _state_file(tmp_path, trained),
        {"X-Metrics": json.dumps(METRICS), "X-Client": json.dumps({"kind": "node"})},
    )
    assert code == 200 and json.loads(body) == {"accepted": True, "reason": None}
    thread.join()
    assert answer["code"] == 200
    arrays = npz_to_arrays(answer["body"])
    for name, value in trained.items():  # relayed bit for bit
        assert arrays[name].dtype == value.dtype and np.array_equal(arrays[name], value)
    assert json.loads(answer["headers"]["X-Metrics"]) == METRICS
    assert json.loads(answer["headers"]["X-Client"]) == {"kind": "node"}


BAD_RESULTS = {
    "nan": ({"w": np.full((2, 3), np.nan, np.float32), "b": GLOBAL["b"]}, METRICS, "non-finite"),
    "missing name": ({"w": GLOBAL["w"]}, METRICS, "missing 'b'"),
    "extra name": ({**GLOBAL, "w.exp_avg": GLOBAL["w"]}, METRICS, "unknown 'w.exp_avg'"),
    "dtype": ({**GLOBAL, "b": GLOBAL["b"].astype(np.float64)}, METRICS, "float64"),
    "shape": ({**GLOBAL, "w": GLOBAL["w"].reshape(3, 2)}, METRICS, "shape (3, 2)"),
    "no weight": (GLOBAL, {k: v for k, v in METRICS.items() if k != "num-examples"}, "lack"),
    "zero weight": (GLOBAL, {**METRICS, "num-examples": 0}, "whole number"),
    "nan loss": (GLOBAL, {**METRICS, "train-loss": None}, "not a finite number"),
}


@pytest.mark.parametrize("case", BAD_RESULTS)
def test_a_bad_result_fails_the_round_with_the_servers_reason(relay, tmp_path, case):
    arrays, metrics, said = BAD_RESULTS[case]
    thread, answer = _bridge(relay, 0)
    task, _ = _take(relay, 0)
    _, body, _ = _request(
        f"{relay.slot_url(0)}/tasks/{task['id']}/result",
        _state_file(tmp_path, arrays),
        {"X-Metrics": json.dumps(metrics)},
    )
    thread.join()
    assert json.loads(body)["accepted"] is False
    assert answer["code"] == 422 and said in json.loads(answer["body"])["reason"]


def test_a_file_of_another_format_or_no_safetensors_is_refused(relay, tmp_path):
    for posted, said in ((_state_file(tmp_path, GLOBAL, "other/1"), "format"), (b"junk", "read")):
        thread, answer = _bridge(relay, 0)
        task, _ = _take(relay, 0)
        _request(
            f"{relay.slot_url(0)}/tasks/{task['id']}/result",
            posted,
            {"X-Metrics": json.dumps(METRICS)},
        )
        thread.join()
        assert answer["code"] == 422 and said in json.loads(answer["body"])["reason"]


def test_a_client_that_stops_beating_mid_round_is_dropped(relay):
    code, body, _ = _request(f"{relay.url}/claim", json.dumps({"kind": "browser"}).encode())
    assert code == 200 and json.loads(body) == {"slot": 1}  # the one browser slot
    thread, answer = _bridge(relay, 1)
    _take(relay, 1)  # ... and the tab is closed: no beat, no result
    thread.join()
    reason = json.loads(answer["body"])["reason"]
    assert answer["code"] == 422 and "disconnected during the round" in reason
    # its slot is free again for another tab
    code, body, _ = _request(f"{relay.url}/claim", json.dumps({"kind": "browser"}).encode())
    assert json.loads(body) == {"slot": 1}


def test_a_slot_no_client_joins_times_out_with_a_reason(relay):
    thread, answer = _bridge(relay, 0, timeout=1.0)
    thread.join()
    reason = json.loads(answer["body"])["reason"]
    assert answer["code"] == 422 and "no client ever joined" in reason


def test_the_client_hears_the_end_and_fetches_artifacts(relay):
    assert _request(f"{relay.url}/files/step_model.onnx")[1] == b"model"
    assert _request(f"{relay.url}/files/nothing")[0] == 404
    relay.finish()
    assert json.loads(_request(f"{relay.slot_url(0)}/task")[1]) == {"status": "done"}
