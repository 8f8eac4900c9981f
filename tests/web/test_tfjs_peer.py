"""The TensorFlow.js peer rows of ``benchmarks/bench_web.py --peers tfjs`` train what onnxblocks trains.

``benchmarks/web_tfjs.py`` gives TensorFlow.js 4.22 the demo classifier's initial weights, batches
and learning rates; ``benchmarks/tfjs/train.mjs`` matches the loss and AdamW. So the rows are a
comparison of speed only if TensorFlow.js's losses are onnxblocks' losses: in Node (pure-JS ``cpu``
and ``wasm``) and in headless Chromium (``wasm``), 30 steps against Python's portable backend on
the same artifacts, the first 10 within 1e-5 relative, and the loss falls.

Fails, never skips, without Node, npm (and the registry on first use) or Chromium.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from support import web_support
from support.numerics import assert_close

from onnxblocks.runtime import TrainingSession
from onnxblocks.web import build_site, spiral_plan
from onnxblocks.web.server import serving

STEPS, COMPARED = 30, 10
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _web_tfjs():
    spec = importlib.util.spec_from_file_location("web_tfjs", BENCHMARKS / "web_tfjs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """``(web_tfjs, tfjs workspace, js workspace, chromium, site, plan file, Python's losses)``."""
    web_tfjs = _web_tfjs()
    scratch = tmp_path_factory.mktemp("tfjs")
    try:
        js, chromium = web_support.workspace(scratch), web_support.chromium()
        tfjs = web_tfjs.workspace(scratch)
    except (web_support.WebEnvError, OSError) as exc:
        pytest.fail(f"the TensorFlow.js peer needs Node, npm and Chromium: {exc}")
    site = build_site(scratch / "site")
    plan = spiral_plan()
    plan_file = web_tfjs.write_plan(scratch / "plan.json", site / "artifacts", plan, STEPS)
    session = TrainingSession(site / "artifacts")
    python = []
    for step in range(STEPS):
        session.learning_rate = float(plan.learning_rates[step])
        python.append(float(session.train_and_update(*plan.batch(step))[0]))
    return web_tfjs, tfjs, js, chromium, site, plan_file, python


def _check(report: dict, python: list[float], where: str) -> None:
    losses = report["losses"]
    assert report["version"] == "4.22.0" and len(losses) == STEPS
    # two float32 trainers, neither the truth: rule 1 of support.numerics, the floor from the size
    assert_close(
        np.float32(losses[:COMPARED]),
        np.float32(python[:COMPARED]),
        rtol=1e-5,
        name=f"TF.js losses ({where}) against onnxblocks",
    )
    assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), f"TF.js ({where}) does not train"


@pytest.mark.parametrize("backend", ["cpu", "wasm"])
def test_tfjs_in_node_trains_the_demo_classifier_as_onnxblocks_does(setup, backend):
    web_tfjs, tfjs, _, _, _, plan_file, python = setup
    report = web_tfjs.node_run(tfjs, plan_file, STEPS, backend)
    assert report["backend"] == backend
    _check(report, python, f"Node {backend}")


def test_tfjs_in_chromium_on_wasm_trains_the_demo_classifier_as_onnxblocks_does(setup):
    web_tfjs, tfjs, js, chromium, site, plan_file, python = setup
    web_tfjs.stage_page(site, tfjs, plan_file)
    with serving(site) as url:
        report = web_tfjs.browser_run(js, chromium, url, STEPS, "wasm")
    assert report["backend"] == "wasm" and report["offOrigin"] == []
    _check(report, python, "Chromium wasm")
