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
sys.path.insert(0, str(HERE.parent))  # web_cnn, also when a test loads this file by its path

import web_cnn  # noqa: E402
from support import web_support  # noqa: E402
from support.cache_lock import cache_dir, cache_lock  # noqa: E402

from onnxblocks.web import read_safetensors  # noqa: E402
from onnxblocks.web.npm import _install  # noqa: E402

#: the demo's loss (onnxblocks.demo: label smoothing and the L2 weight) and AdamW's moments
LOSS = {"l2": 1e-4, "labelSmoothing": 0.05, "betas": [0.9, 0.999], "eps": 1e-8}
#: the version of the TensorFlow.js packages (benchmarks/tfjs/package.json)
TFJS_VERSION = "4.22.0"
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
    if (target / "node_modules").exists():  # made by an earlier call
        return target
    shutil.copytree(HERE, target, ignore=shutil.ignore_patterns("node_modules"))
    (target / "node_modules").symlink_to(node_modules(), target_is_directory=True)
    return target


def write_plan(path: Path, artifacts: Path, plan, steps: int, model: str = "mlp") -> Path:
    """The plan ``train.mjs`` reads: the artifacts' initial weights (in TensorFlow.js's layout),
    ``steps`` batches and learning rates, the loss and the optimizer's settings.

    ``model``: ``"mlp"`` (the demo classifier, its loss) or ``"cnn"`` (``web_cnn``, cross
    entropy).
    """
    params, _ = read_safetensors(artifacts / "params.safetensors")
    if model == "cnn":
        params = web_cnn.tfjs_params(params)
        loss = {**LOSS, "l2": 0.0, "labelSmoothing": 0.0, "l2Weights": []}
    else:
        loss = {**LOSS, "l2Weights": sorted(n for n in params if n.endswith(".weight"))}
    batches = [plan.batch(step) for step in range(steps)]
    content = {
        "model": model,
        "params": {
            name: {"shape": list(v.shape), "values": np.asarray(v, np.float32).reshape(-1).tolist()}
            for name, v in params.items()
        },
        "features": [np.asarray(f, np.float32).reshape(-1).tolist() for f, _ in batches],
        "onnxShape": list(np.shape(batches[0][0])[1:]),
        "featureShape": list(
            web_cnn.TFJS_FEATURES if model == "cnn" else np.shape(batches[0][0])[1:]
        ),
        "labels": [np.asarray(y).astype(int).tolist() for _, y in batches],
        "learningRates": [float(r) for r in plan.learning_rates[:steps]],
        "classes": int(params["fc.bias" if model == "cnn" else f"fc{len(params) // 2}.bias"].size),
        "bnEps": web_cnn.BN_EPS,
        **loss,
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
    shutil.copyfile(plan_file, page / plan_file.name)
    for package, names in DIST.items():
        for name in names:
            shutil.copyfile(tfjs / "node_modules" / "@tensorflow" / package / "dist" / name,
                            page / name)  # fmt: skip
    return page


def browser_run(
    js: Path, chromium: Path, url: str, steps: int, backend: str, plan: Path | None = None
) -> dict:
    """The page on ``backend`` in headless Chromium (``js``'s driver), on ``plan`` (a file that
    :func:`stage_page` put beside it; default ``plan.json``): as :func:`node_run`.
    """
    query = f"backend={backend}&steps={steps}&plan={plan.name if plan else 'plan.json'}"
    report = web_support.run_node(
        js, "tools/browser-run.mjs", f"{url}tfjs/index.html?{query}",
        "--chromium", str(chromium), "--timeout", "800", timeout=900,
    )  # fmt: skip
    if report.get("status") != "done":
        raise RuntimeError(f"TensorFlow.js on {backend} in Chromium failed: {report.get('error')}")
    return report


def _failure(error: Exception) -> str:
    """Why ``error`` failed: from TensorFlow.js's first ``Error:``, else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line[line.index("Error:") :] for line in lines if "Error:" in line]
    said += [line for line in lines if line.startswith("onnxblocks-train:")]
    return (said or lines or ["failed"])[0]


def _tfjs_rows(
    js: Path, chromium: Path, site: Path, tfjs: Path, plan_file: Path, steps: int,
    gpu_steps: int, rounds: int,
) -> list[tuple[str, float | None, list[float] | str]]:  # fmt: skip
    """TensorFlow.js on ``plan_file``: ``(label, median seconds per step, losses)``, Node then
    Chromium; ``gpu_steps`` steps on WebGL and WebGPU, ``steps`` on the others. A backend that
    fails gives ``(label, None, why)``.
    """
    from onnxblocks.web.server import serving

    page = stage_page(site, tfjs, plan_file)
    times: dict[str, list[float]] = {}
    losses: dict[str, list[float] | str] = {}

    def run(label: str, n: int, go) -> None:
        try:
            report = go()
        except (AssertionError, RuntimeError) as exc:
            times.setdefault(label, [])
            losses[label] = _failure(exc)
            return
        times.setdefault(label, []).append(report["seconds"] / n)
        losses[label] = report["losses"]

    for _ in range(rounds):
        for backend in NODE_BACKENDS:
            run(
                f"Node, TF.js {TFJS_VERSION} {backend}", steps,
                lambda b=backend: node_run(tfjs, plan_file, steps, b),
            )  # fmt: skip
        with serving(site) as url:
            for backend in BROWSER_BACKENDS:
                n = steps if backend == "wasm" else gpu_steps
                shader = "" if backend == "wasm" else " (SwiftShader)"
                run(
                    f"browser, TF.js {TFJS_VERSION} {backend}{shader}", n,
                    lambda b=backend, n=n: browser_run(
                        js, chromium, url, n, b, page / plan_file.name
                    ),
                )  # fmt: skip
    return [
        (label, float(np.median(t)) if t else None, losses[label]) for label, t in times.items()
    ]


def peer_rows(
    js: Path, chromium: Path, site: Path, plan, steps: int, gpu_steps: int, rounds: int,
    scratch: Path,
) -> list[tuple[str, float, list[float]]]:  # fmt: skip
    """TensorFlow.js's rows of the demo classifier: ``(label, median seconds per step, losses)``.

    ``steps`` steps on the CPU backends (Node's ``cpu`` and ``wasm``, the browser's ``wasm``),
    ``gpu_steps`` on WebGL and WebGPU (SwiftShader without a GPU), ``rounds`` runs of each.
    """
    tfjs = workspace(scratch)
    plan_file = write_plan(scratch / "tfjs-mlp.json", site / "artifacts", plan, steps)
    rows = _tfjs_rows(js, chromium, site, tfjs, plan_file, steps, gpu_steps, rounds)
    for label, seconds, losses in rows:
        if seconds is None:
            raise RuntimeError(f"{label} failed on the demo classifier: {losses}")
    return rows  # type: ignore[return-value]


def cnn_table(
    js: Path, chromium: Path, site: Path, steps: int, gpu_steps: int, rounds: int,
    scratch: Path, python_run, node_run_onnxblocks,
) -> list[str]:  # fmt: skip
    """The CNN's table (``web_cnn``): onnxblocks in Python and in Node (onnxruntime-node cpu and
    webgpu, ``node_run_onnxblocks``), TensorFlow.js as in :func:`peer_rows`; printable lines.
    onnxblocks' browser rows of the CNN are in ``bench_web.py --wasm cnn`` (``web_wasm``).
    """
    artifacts = web_cnn.write_artifacts(scratch / "cnn")
    shutil.copytree(artifacts, site / "cnn", dirs_exist_ok=True)
    plan = web_cnn.CnnPlan(steps)
    tfjs = workspace(scratch)
    plan_file = write_plan(scratch / "tfjs-cnn.json", artifacts, plan, steps, "cnn")
    py, node, node_gpu = [], [], []
    gpu_losses: list[float] | str = []
    for _ in range(rounds):
        python, seconds = python_run(artifacts, plan, steps)
        py.append(seconds)
        node_losses, seconds = node_run_onnxblocks(js, artifacts, plan, steps, scratch)
        node.append(seconds)
        try:
            gpu_losses, seconds = node_run_onnxblocks(
                js, artifacts, plan, gpu_steps, scratch, "webgpu"
            )
            node_gpu.append(seconds)
        except AssertionError as exc:
            gpu_losses = _failure(exc)
    rows = [
        ("Python, TrainingSession (portable backend)", float(np.median(py)), python),
        ("Node, onnxruntime-node cpu", float(np.median(node)), node_losses),
        (
            "Node, onnxruntime-node webgpu (SwiftShader)",
            float(np.median(node_gpu)) if node_gpu else None,
            gpu_losses,
        ),
        *_tfjs_rows(js, chromium, site, tfjs, plan_file, steps, gpu_steps, rounds),
    ]
    first, python_step = np.array(python[:20]), float(np.median(py))
    lines = [
        f"CNN with BatchNorm (benchmarks/web_cnn.py), batch {web_cnn.BATCH}, AdamW, {steps} steps "
        f"({gpu_steps} on WebGL/WebGPU); loss {np.mean(python[:10]):.3f} -> "
        f"{np.mean(python[-10:]):.3f} (means of the first and last 10 steps, Python)",
    ]
    for name, seconds, losses in rows:
        if seconds is None or isinstance(losses, str):
            lines.append(f"{name:<52} fails: {losses}")
            continue
        head = np.array(losses[:20])
        gap = float(np.max(np.abs(head - first[: len(head)]) / np.abs(first[: len(head)])))
        fall = f"{np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}"
        lines.append(
            f"{name:<52} {seconds * 1e3:>8.3f} {1 / seconds:>8.0f} {seconds / python_step:>8.2f} "
            f"{gap:>10.1e} {fall:>16}"
        )  # fmt: skip
    return lines
