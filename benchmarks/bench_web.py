"""Training the demo's spiral classifier in Python, Node and the browser: time per step and loss
agreement.

On the portable artifacts of ``onnxblocks demo`` (MLP 2-64-64-3, batch 32, AdamW),
with the batches and learning rates of the demo's plan (``onnxblocks.web.spiral_plan``):

* **Python**: ``TrainingSession.step`` (portable backend, this venv's onnxruntime);
* **Node**: ``js/bin/onnxblocks-train.mjs`` on onnxruntime-node (one intra-op thread),
  the loop's own time (session creation excluded);
* **browser**: the demo page in headless Chromium (onnxruntime-web WASM, one thread),
  steps per second of the whole page, i.e. including the validation and the
  decision-region evaluation after each epoch and the drawing.

and the largest relative difference of the first 20 losses against Python's.
Needs Node, npm and Chromium (set up as the tests do, tests/support/web_support.py).

    python benchmarks/bench_web.py [--steps 900] [--rounds 3]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import web_support  # noqa: E402

from onnxblocks.runtime import TrainingSession  # noqa: E402
from onnxblocks.web import build_site, serving, spiral_plan, write_safetensors  # noqa: E402


def python_run(artifacts: Path, plan, steps: int) -> tuple[list[float], float]:
    session = TrainingSession(artifacts)
    losses = []
    started = time.perf_counter()
    for step in range(steps):
        session.learning_rate = float(plan.learning_rates[step])
        losses.append(float(session.train_and_update(*plan.batch(step))[0]))
    return losses, (time.perf_counter() - started) / steps


def node_run(
    js: Path, artifacts: Path, plan, steps: int, scratch: Path
) -> tuple[list[float], float]:
    tensors = {}
    for step in range(steps):
        features, labels = plan.batch(step)
        tensors[f"train/{step}/features"], tensors[f"train/{step}/labels"] = features, labels
    rates = json.dumps(plan.learning_rates[:steps].tolist())
    write_safetensors(scratch / "plan.safetensors", tensors, {"learning_rates": rates})
    report = web_support.run_node(
        js, "bin/onnxblocks-train.mjs", str(artifacts), "--plan", str(scratch / "plan.safetensors")
    )
    return report["losses"], report["seconds"] / steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=900, help="training steps per run (default: the whole demo)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs of each; the median is reported"
    )
    args = parser.parse_args()
    plan = spiral_plan()
    steps = min(args.steps, plan.steps)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        js, chromium = web_support.workspace(scratch), web_support.chromium()
        dist = web_support.node_modules() / "onnxruntime-web" / "dist"
        site = build_site(scratch / "site", ort_web_dist=dist)
        artifacts = site / "artifacts"
        py, node, page = [], [], []
        for _ in range(args.rounds):
            py_losses, seconds = python_run(artifacts, plan, steps)
            py.append(seconds)
            node_losses, seconds = node_run(js, artifacts, plan, steps, scratch)
            node.append(seconds)
            with serving(site) as url:
                report = web_support.run_node(
                    js,
                    "tools/browser-run.mjs",
                    f"{url}demo/?steps={steps}",
                    "--chromium",
                    str(chromium),
                    timeout=900,
                )
            page.append(1 / report["stepsPerSecond"])
        first = np.array(py_losses[:20])
        node_diff = float(np.max(np.abs(np.array(node_losses[:20]) - first) / np.abs(first)))
        page_diff = float(np.max(np.abs(np.array(report["losses"][:20]) - first) / np.abs(first)))
    print(
        f"spiral classifier 2-64-64-3, batch 32, AdamW, {steps} steps, median of {args.rounds} runs"
    )
    print(f"{'runtime':<44} {'ms/step':>8} {'steps/s':>8} {'max rel diff, 20 losses':>24}")
    rows = [
        ("Python, TrainingSession (portable backend)", statistics.median(py), "reference"),
        (
            f"Node, onnxruntime-node {report['onnxruntime']}",
            statistics.median(node),
            f"{node_diff:.1e}",
        ),
        (
            f"browser page, onnxruntime-web {report['onnxruntime']} WASM*",
            statistics.median(page),
            f"{page_diff:.1e}",
        ),
    ]
    for name, seconds, diff in rows:
        print(f"{name:<44} {seconds * 1e3:>8.3f} {1 / seconds:>8.0f} {diff:>24}")
    print(
        f"* Chromium {report['chromium']}, whole page: includes the evaluation after each epoch "
        "and the drawing"
    )


if __name__ == "__main__":
    main()
