"""Training the demo's spiral classifier in Python, Node and the browser: time per step and loss
agreement.

On the portable artifacts of ``onnxblocks demo`` (MLP 2-64-64-3, batch 32, AdamW),
with the batches and learning rates of the demo's plan (``onnxblocks.web.spiral_plan``):

* **Python**: ``TrainingSession.step`` (portable backend, this venv's onnxruntime);
* **Node**: ``js/bin/onnxblocks-train.mjs`` on onnxruntime-node (one intra-op thread),
  the loop's own time (session creation excluded);
* **browser**: the demo page in headless Chromium, the page's own steps per second (the
  training steps' time; evaluation and drawing excluded), on onnxruntime-web's WASM with one
  thread (``?threads=1``) and with every core (the server's COOP/COEP headers make the page
  cross-origin isolated), and on WebGPU (``?ep=webgpu``, default and ``/webgpu`` bundles;
  SwiftShader without a GPU) for ``--gpu-steps`` steps;
* **Node on webgpu**: ``onnxblocks-train --ep webgpu`` (Vulkan SwiftShader from Debian's chromium
  without a GPU), ``--gpu-steps`` steps.

and the largest relative difference of the first 20 losses against Python's.
Needs Node, npm and Chromium (set up as the tests do, tests/support/web_support.py).

    python benchmarks/bench_web.py [--steps 900] [--gpu-steps 60] [--rounds 3] [--peers tfjs]
    python benchmarks/bench_web.py --wasm mlp cnn lora [--wasm-steps N]

``--wasm`` prints only the WASM speed table (``benchmarks/web_wasm.py``): each model in Python,
onnxruntime-node and Chromium's WASM (1 thread, every core) through the client's plan page,
the mean step and the step after Chromium has optimized onnxruntime-web's WASM.

``--peers tfjs`` adds TensorFlow.js 4.22 rows on the same model, weights, batches and optimizer
(``benchmarks/web_tfjs.py``): Node ``cpu`` and ``wasm``; Chromium ``wasm``, ``webgl``, ``webgpu``.

The load average is printed before and after: the figures mean little on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import web_tfjs  # noqa: E402
import web_wasm  # noqa: E402
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
    js: Path, artifacts: Path, plan, steps: int, scratch: Path, ep: str = "cpu"
) -> tuple[list[float], float]:
    tensors = {}
    for step in range(steps):
        features, labels = plan.batch(step)
        tensors[f"train/{step}/features"], tensors[f"train/{step}/labels"] = features, labels
    rates = json.dumps(plan.learning_rates[:steps].tolist())
    write_safetensors(scratch / "plan.safetensors", tensors, {"learning_rates": rates})
    env = web_support.swiftshader_env() if ep == "webgpu" else None
    report = web_support.run_node(
        js, "bin/onnxblocks-train.mjs", str(artifacts), "--plan", str(scratch / "plan.safetensors"),
        "--ep", ep, env=env, timeout=900,
    )  # fmt: skip
    return report["losses"], report["seconds"] / steps


#: the browser rows: label, query
PAGES = (
    ("WASM, 1 thread", "threads=1"),
    # the page's own default is one thread for a model this small (docs/web.md): ask for every core
    ("WASM, every core", f"threads={os.cpu_count() or 1}"),
    ("WebGPU, default bundle", "ep=webgpu"),
    ("WebGPU, /webgpu bundle", "ep=webgpu&bundle=webgpu"),
)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


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
    parser.add_argument(
        "--gpu-steps", type=int, default=60, help="steps of the WebGPU rows (default: 60)"
    )
    parser.add_argument(
        "--peers",
        nargs="*",
        default=[],
        choices=["tfjs"],
        help="also train with TensorFlow.js 4.22 (benchmarks/web_tfjs.py), rows beside these",
    )
    parser.add_argument(
        "--wasm",
        nargs="+",
        choices=web_wasm.MODELS,
        help="print only the WASM speed table of these models (benchmarks/web_wasm.py)",
    )
    parser.add_argument(
        "--wasm-steps",
        type=int,
        help="steps of each --wasm model (default: mlp 3000, cnn 1500, lora 5)",
    )
    args = parser.parse_args()
    if args.wasm:
        with tempfile.TemporaryDirectory() as tmp:
            js, chromium = web_support.workspace(Path(tmp)), web_support.chromium()
            dist = web_support.node_modules() / "onnxruntime-web" / "dist"
            site = build_site(Path(tmp) / "site", ort_web_dist=dist)
            print(f"{os.cpu_count()} cores, Chromium {chromium}", flush=True)
            web_wasm.table(js, chromium, site, args.wasm, args.wasm_steps)
        return
    plan = spiral_plan()
    steps = min(args.steps, plan.steps)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        js, chromium = web_support.workspace(scratch), web_support.chromium()
        dist = web_support.node_modules() / "onnxruntime-web" / "dist"
        site = build_site(scratch / "site", ort_web_dist=dist)
        artifacts = site / "artifacts"
        gpu_steps = min(args.gpu_steps, steps)
        before = load()
        py, node, node_gpu = [], [], []
        pages: dict[str, list[float]] = {label: [] for label, _ in PAGES}
        reports: dict[str, dict] = {}
        for _ in range(args.rounds):
            py_losses, seconds = python_run(artifacts, plan, steps)
            py.append(seconds)
            node_losses, seconds = node_run(js, artifacts, plan, steps, scratch)
            node.append(seconds)
            gpu_losses, seconds = node_run(js, artifacts, plan, gpu_steps, scratch, "webgpu")
            node_gpu.append(seconds)
            with serving(site) as url:
                for label, query in PAGES:
                    n = gpu_steps if "ep=webgpu" in query else steps
                    report = web_support.run_node(
                        js, "tools/browser-run.mjs", f"{url}demo/?steps={n}&{query}",
                        "--chromium", str(chromium), timeout=900,
                    )  # fmt: skip
                    if report["status"] != "done":
                        raise RuntimeError(f"the page on {label} failed: {report['error']}")
                    pages[label].append(1 / report["stepsPerSecond"])
                    reports[label] = report
        first = np.array(py_losses[:20])
        node_version = web_support_version(js)

        def diff(losses: list[float]) -> str:
            return f"{float(np.max(np.abs(np.array(losses[:20]) - first) / np.abs(first))):.1e}"

        peers, cnn_lines = [], []
        if "tfjs" in args.peers:
            cnn_lines = web_tfjs.cnn_table(
                js, chromium, site, steps, gpu_steps, args.rounds, scratch, python_run, node_run
            )
            for name, seconds, losses in web_tfjs.peer_rows(
                js, chromium, site, plan, steps, gpu_steps, args.rounds, scratch
            ):
                peers.append((name, seconds, diff(losses)))

    python_step = statistics.median(py)
    print(
        f"spiral classifier 2-64-64-3, batch 32, AdamW, {steps} steps ({gpu_steps} on WebGPU), "
        f"median of {args.rounds} runs; {os.cpu_count()} cores, load average {before} before, "
        f"{load()} after"
    )
    print(
        f"{'runtime':<52} {'ms/step':>8} {'steps/s':>8} {'x Python':>8} "
        f"{'max rel diff, 20 losses':>24}"
    )
    web = next(iter(reports.values()))
    rows = [
        ("Python, TrainingSession (portable backend)", python_step, "reference"),
        (f"Node, onnxruntime-node {node_version} cpu", statistics.median(node),
         diff(node_losses)),
        ("Node, webgpu (SwiftShader)", statistics.median(node_gpu), diff(gpu_losses)),
    ]  # fmt: skip
    for label, _ in PAGES:
        report = reports[label]
        name = f"browser, onnxruntime-web {report['onnxruntime']} {label} ({report['threads']} thr)"
        rows.append((name, statistics.median(pages[label]), diff(report["losses"])))
    rows += peers
    for name, seconds, difference in rows:
        print(
            f"{name:<52} {seconds * 1e3:>8.3f} {1 / seconds:>8.0f} {seconds / python_step:>8.2f} "
            f"{difference:>24}"
        )
    print(
        f"Chromium {web['chromium']}, crossOriginIsolated {web['crossOriginIsolated']}; "
        "the page's steps/s counts its training steps only"
    )
    if cnn_lines:
        print(f"\n{cnn_lines[0]}")
        print(f"{'runtime':<52} {'ms/step':>8} {'steps/s':>8} {'x Python':>8} {'rel diff':>10} "
              f"{'loss fall':>16}")  # fmt: skip
        print("\n".join(cnn_lines[1:]))


def web_support_version(js: Path) -> str:
    package = js / "node_modules" / "onnxruntime-node" / "package.json"
    return json.loads(package.read_text())["version"]


if __name__ == "__main__":
    main()
