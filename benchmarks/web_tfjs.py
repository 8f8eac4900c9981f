"""The TensorFlow.js 4.22 peer rows of ``benchmarks/bench_web.py --peers tfjs``.

TensorFlow.js trains the demo classifier as the onnxblocks rows do: the same MLP, initial weights
(the artifacts' ``params.safetensors``), batches, learning rates, loss and optimizer
(``benchmarks/tfjs/train.mjs`` says how each is matched), in

* Node: the pure-JavaScript ``cpu`` backend and ``@tensorflow/tfjs-backend-wasm``;
* headless Chromium (the same flags as the demo's driver, ``--enable-unsafe-webgpu``): ``wasm``,
  ``webgl`` and ``webgpu`` (``@tensorflow/tfjs-backend-webgpu``). Without a GPU, WebGL and WebGPU
  run on SwiftShader (the CPU): their speed says nothing of a GPU's.

``@tensorflow/tfjs-node`` (TensorFlow's C library) is not a row: its install script downloads
``libtensorflow-cpu-linux-x86_64-2.9.1.tar.gz`` from storage.googleapis.com, which a machine with
only the npm registry cannot reach (``getaddrinfo ENOTFOUND storage.googleapis.com``, exit 1).

The packages (``benchmarks/tfjs/package.json`` and its lock) are ``npm ci``-installed once into
``~/.cache/onnxblocks-test/tfjs-<hash>``, as the client's are (tests/support/web_support.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "tfjs"
sys.path.insert(0, str(ROOT / "tests"))

from support import web_support  # noqa: E402
from support.cache_lock import cache_dir, cache_lock  # noqa: E402

from onnxblocks.web import read_safetensors  # noqa: E402
from onnxblocks.web.npm import _install  # noqa: E402

#: the demo's loss (onnxblocks.demo: label smoothing and the L2 weight) and AdamW's moments
LOSS = {"l2": 1e-4, "labelSmoothing": 0.05, "betas": [0.9, 0.999], "eps": 1e-8}
#: TensorFlow.js backends: Node, and the browser page's ``?backend=``
NODE_BACKENDS = ("cpu", "wasm")
BROWSER_BACKENDS = ("wasm", "webgl", "webgpu")
#: the browser files each package contributes to the served page
DIST = {
    "tfjs": ("tf.min.js",),
    "tfjs-backend-wasm": (
        "tf-backend-wasm.min.js",
        "tfjs-backend-wasm.wasm",
        "tfjs-backend-wasm-simd.wasm",
        "tfjs-backend-wasm-threaded-simd.wasm",
    ),
    "tfjs-backend-webgpu": ("tf-backend-webgpu.min.js",),
}


def node_modules() -> Path:
    """TensorFlow.js's packages, ``npm ci``-installed into the test cache once per lock file."""
    files = {n: (HERE / n).read_bytes() for n in ("package.json", "package-lock.json")}
    key = hashlib.sha256(
        b"".join(n.encode() + b"\0" + d + b"\0" for n, d in files.items())
    ).hexdigest()[:16]
    with cache_lock("tfjs"):
        return _install(cache_dir() / f"tfjs-{key}", files, ["ci"], "Installing TensorFlow.js", 900)


def workspace(directory: Path) -> Path:
    """``benchmarks/tfjs`` copied into ``directory/tfjs`` beside a link to its ``node_modules``."""
    target = directory / "tfjs"
    shutil.copytree(HERE, target, ignore=shutil.ignore_patterns("node_modules"))
    (target / "node_modules").symlink_to(node_modules(), target_is_directory=True)
    return target


def write_plan(path: Path, artifacts: Path, plan, steps: int) -> Path:
    """The plan ``train.mjs`` reads: the artifacts' initial weights, ``steps`` batches and rates."""
    params, _ = read_safetensors(artifacts / "params.safetensors")
    layers = []
    for i in range(1, len(params) // 2 + 1):
        weight, bias = params[f"fc{i}.weight"], params[f"fc{i}.bias"]
        layers.append(
            {
                "weight": weight.reshape(-1).tolist(),
                "bias": bias.tolist(),
                "in": int(weight.shape[0]),
                "out": int(weight.shape[1]),
            }
        )
    batches = [plan.batch(step) for step in range(steps)]
    content = {
        "layers": layers,
        "features": [np.asarray(f, np.float32).reshape(-1).tolist() for f, _ in batches],
        "labels": [np.asarray(y).astype(int).tolist() for _, y in batches],
        "learningRates": [float(r) for r in plan.learning_rates[:steps]],
        "classes": layers[-1]["out"],
        **LOSS,
    }
    path.write_text(json.dumps(content))
    return path


def node_run(tfjs: Path, plan_file: Path, steps: int, backend: str) -> dict:
    """TensorFlow.js in Node on ``backend``: ``{losses, seconds, backend, version}``."""
    return web_support.run_node(tfjs, "node.mjs", str(plan_file), str(steps), backend, timeout=900)


def stage_page(site: Path, tfjs: Path, plan_file: Path) -> Path:
    """Put the page, ``train.mjs``, the plan and the browser files of TensorFlow.js in
    ``site/tfjs``.
    """
    page = site / "tfjs"
    page.mkdir(parents=True, exist_ok=True)
    for name in ("index.html", "train.mjs"):
        shutil.copyfile(tfjs / name, page / name)
    shutil.copyfile(plan_file, page / "plan.json")
    for package, names in DIST.items():
        for name in names:
            shutil.copyfile(tfjs / "node_modules" / "@tensorflow" / package / "dist" / name,
                            page / name)  # fmt: skip
    return page


def browser_run(js: Path, chromium: Path, url: str, steps: int, backend: str) -> dict:
    """The page on ``backend`` in headless Chromium (``js``'s driver): as :func:`node_run`."""
    report = web_support.run_node(
        js, "tools/browser-run.mjs", f"{url}tfjs/index.html?backend={backend}&steps={steps}",
        "--chromium", str(chromium), "--timeout", "800", timeout=900,
    )  # fmt: skip
    if report.get("status") != "done":
        raise RuntimeError(f"TensorFlow.js on {backend} in Chromium failed: {report.get('error')}")
    return report


def peer_rows(
    js: Path, chromium: Path, site: Path, plan, steps: int, gpu_steps: int, rounds: int,
    scratch: Path,
) -> list[tuple[str, float, list[float]]]:  # fmt: skip
    """TensorFlow.js's rows: ``(label, median seconds per step, losses)``, Node then Chromium.

    ``steps`` steps on the CPU backends (Node's ``cpu`` and ``wasm``, the browser's ``wasm``),
    ``gpu_steps`` on WebGL and WebGPU (SwiftShader without a GPU), ``rounds`` runs of each.
    """
    from onnxblocks.web.server import serving

    tfjs = workspace(scratch)
    plan_file = write_plan(scratch / "tfjs-plan.json", site / "artifacts", plan, steps)
    stage_page(site, tfjs, plan_file)
    times: dict[str, list[float]] = {}
    losses: dict[str, list[float]] = {}
    for _ in range(rounds):
        for backend in NODE_BACKENDS:
            report = node_run(tfjs, plan_file, steps, backend)
            label = f"Node, TF.js {report['version']} {backend}"
            times.setdefault(label, []).append(report["seconds"] / steps)
            losses[label] = report["losses"]
        with serving(site) as url:
            for backend in BROWSER_BACKENDS:
                n = steps if backend == "wasm" else gpu_steps
                report = browser_run(js, chromium, url, n, backend)
                shader = "" if backend == "wasm" else " (SwiftShader)"
                label = f"browser, TF.js {report['version']} {backend}{shader}"
                times.setdefault(label, []).append(report["seconds"] / n)
                losses[label] = report["losses"]
    return [(label, float(np.median(times[label])), losses[label]) for label in times]
