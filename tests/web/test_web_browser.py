"""``onnxblocks demo --web`` from the installed wheel, in headless Chromium: the page trains, offline, as Python does.

The test builds the wheel from this checkout, installs it into a fresh venv (outside
the checkout, so the JavaScript client comes from the wheel's package data), runs the
user's command (``onnxblocks demo --web --port 0``, which npm-installs onnxruntime-web
into a cache on first use), drives Debian's Chromium with playwright-core (never a
downloaded browser) through the whole demo, and checks: the first 20 losses equal
Python's on the same artifacts, batches and learning rates within 1e-5 relative; the
page reaches the demo's accuracy target; the parameters it exports load into Python
and give the page's accuracy; the ``.onnx`` it downloads runs in
``onnxruntime.InferenceSession`` with the page's accuracy; steps/s is never Infinity
or NaN; the layout does not overflow at 360 and 420 px; the epochs and learning-rate
controls train what they say; no request leaves 127.0.0.1; screenshots are taken.

Fails, never skips, without Node, npm or Chromium (tests/support/web_support.py says how to get them).
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading

import numpy as np
import onnxruntime
import pytest
from support import web_support
from support.numerics import assert_close
from support.wheel_env import WheelEnvError, build_wheel, fresh_venv

from onnxblocks.demo import TARGET_ACCURACY
from onnxblocks.runtime import TrainingSession
from onnxblocks.web import load_state, spiral_plan

PARITY_STEPS, RTOL = 20, 1e-5


@pytest.fixture(scope="module")
def browser_env(tmp_path_factory):
    try:
        return web_support.workspace(tmp_path_factory.mktemp("client")), web_support.chromium()
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The Python of a fresh venv with the wheel built from this checkout (and its dependencies)."""
    where = tmp_path_factory.mktemp("wheel")
    try:
        return fresh_venv(where / "venv", build_wheel(where))
    except WheelEnvError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def served(browser_env, installed, tmp_path_factory):
    """``onnxblocks demo --web`` of the installed wheel running in a subprocess: ``(url, output dir)``."""
    out = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ONNXBLOCKS_"))}
    env.update(ONNXBLOCKS_CACHE=str(web_support.cache_dir() / "user-cache"), PYTHONUNBUFFERED="1")
    command = [
        str(installed.parent / "onnxblocks"),
        "demo",
        "--web",
        "--port",
        "0",
        "--output-dir",
        str(out),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=out
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in process.stdout or ()], daemon=True
    ).start()
    seen: list[str] = []
    try:
        while True:
            try:
                line = lines.get(timeout=600)
            except queue.Empty:
                pytest.fail("`onnxblocks demo --web` printed no URL in 600 s:\n" + "".join(seen))
            seen.append(line)
            if line.strip().startswith("open http://127.0.0.1:"):
                break
            if process.poll() is not None and lines.empty():
                pytest.fail(
                    f"`onnxblocks demo --web` exited with {process.returncode}:\n" + "".join(seen)
                )
        yield line.split()[1], out
    finally:
        process.terminate()
        process.wait(timeout=120)


@pytest.fixture(scope="module")
def page(browser_env, served, tmp_path_factory):
    js, chromium = browser_env
    url, out = served
    shots = tmp_path_factory.mktemp("shots")
    report = web_support.run_node(
        js,
        "tools/browser-run.mjs",
        url + "demo/",
        "--chromium", str(chromium),
        "--screenshot", str(shots / "demo.png"),
        "--state", str(shots / "trained.safetensors"),
        "--model", str(shots / "spiral_classifier.onnx"),
        "--widths", "360,420",
        "--timeout", "300",
        timeout=600,
    )  # fmt: skip
    return report, out / "web", shots


def test_the_demo_runs_from_the_installed_wheel(installed, served):
    done = subprocess.run(
        [str(installed), "-c", "import onnxblocks.web.npm as n; print(n.js_dir())"],
        capture_output=True,
        text=True,
        cwd=served[1],
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ONNXBLOCKS_"))},
        check=True,
    )
    client = done.stdout.strip()
    assert "site-packages" in client and client.endswith("onnxblocks/web/js"), client
    site = served[1] / "web"
    assert (site / "src" / "trainer.mjs").read_bytes() == (
        web_support.js_dir() / "src" / "trainer.mjs"
    ).read_bytes()


def test_the_page_trains_offline_without_errors(page):
    report, _, shots = page
    assert report["status"] == "done", report["error"]
    assert report["offOrigin"] == [], "the page must not leave 127.0.0.1 (no CDN)"
    assert [line for line in report["console"] if line.startswith(("error", "pageerror"))] == []
    assert report["onnxruntime"] == "1.30.0" and report["chromium"]
    assert report["steps"] == spiral_plan().steps == len(report["losses"])
    png = (shots / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_browser_losses_equal_python_step_by_step(page):
    report, site, _ = page
    plan = spiral_plan()
    session = TrainingSession(site / "artifacts")
    python = []
    for step in range(PARITY_STEPS):
        session.learning_rate = float(plan.learning_rates[step])
        python.append(float(session.train_and_update(*plan.batch(step))[0]))
    # the page and Python are float32 clients of ours: no float64 truth, the floor from the losses' size
    assert_close(
        np.float32(report["losses"][:PARITY_STEPS]), np.float32(python), rtol=RTOL, name="losses"
    )


def test_browser_reaches_the_demo_accuracy_and_its_parameters_load_into_python(page):
    report, site, shots = page
    plan = spiral_plan()
    accuracy = report["valAccuracy"][-1]
    assert accuracy >= TARGET_ACCURACY
    assert len(report["valAccuracy"]) == 1 + 30  # before training, then after each epoch
    session = TrainingSession(site / "artifacts")
    state = load_state(session, shots / "trained.safetensors")
    assert state.step == plan.steps
    _, logits = session.eval_step(plan.val_features, plan.val_labels)
    assert float(np.mean(logits.argmax(1) == plan.val_labels)) == accuracy


def test_the_downloaded_onnx_runs_in_python_with_the_page_accuracy(page):
    report, _, shots = page
    assert report["modelFile"] == "spiral_classifier.onnx"
    plan = spiral_plan()
    session = onnxruntime.InferenceSession(
        str(shots / "spiral_classifier.onnx"), providers=["CPUExecutionProvider"]
    )
    (logits,) = session.run(None, {session.get_inputs()[0].name: plan.val_features})
    assert float(np.mean(logits.argmax(1) == plan.val_labels)) == report["valAccuracy"][-1]


def test_the_status_and_layout_hold(page):
    report, _, shots = page
    assert report["shown"] and not [
        line for line in report["shown"] if "Infinity" in line or "NaN" in line
    ]
    assert report["stepsPerSecond"] is not None and 0 < report["stepsPerSecond"] < 1e6
    assert report["overflow"] == {"360": 0, "420": 0}, (
        "the page overflows horizontally on a narrow screen"
    )
    assert (shots / "demo-360.png").stat().st_size > 10_000


def test_the_controls_set_epochs_and_learning_rate(browser_env, served):
    js, chromium = browser_env
    url, _ = served
    report = web_support.run_node(
        js, "tools/browser-run.mjs", url + "demo/?epochs=2&lr=0.02&grid=16",
        "--chromium", str(chromium), "--timeout", "300", timeout=600,
    )  # fmt: skip
    plan = spiral_plan()
    assert report["status"] == "done", report["error"]
    assert report["epochs"] == 2 and report["peakLearningRate"] == 0.02
    assert report["steps"] == 2 * plan.batches_per_epoch and len(report["valAccuracy"]) == 3
    session = TrainingSession(
        served[1] / "web" / "artifacts"
    )  # the second loss shows the first step's scaled rate
    session.learning_rate = float(plan.learning_rates[0]) * 0.02 / float(plan.learning_rates.max())
    first = float(session.train_and_update(*plan.batch(0))[0])
    second = float(session.train_and_update(*plan.batch(1))[0])
    assert_close(
        np.float32(report["losses"][:2]), np.float32([first, second]), rtol=RTOL, name="losses"
    )
