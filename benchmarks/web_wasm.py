"""The WASM speed table of ``benchmarks/bench_web.py --wasm mlp cnn lora``.

Each model trains on one plan (``train/<i>/<input>`` batches and ``learning_rates``, the file
``onnxblocks-train --plan`` reads) in

* Python: ``TrainingSession`` (portable backend, this venv's onnxruntime, its default threads);
* Node: ``js/bin/onnxblocks-train.mjs`` on onnxruntime-node's CPU provider, every core;
* headless Chromium: the client's plan page (``js/demo/plan.html``: ``js/src/browser.mjs`` on
  onnxruntime-web's WASM, the site served by ``onnxblocks.web.serving`` with its cross-origin
  isolation headers), with one thread and with every core.

Node and Chromium each train both step models, taking turns: ``step_model.onnx`` (one tensor per
parameter and moment each way) and ``flat_step_model.onnx`` (``onnxblocks.web.write_flat_step``:
one flat state tensor each way, the JS client's default on the CPU providers).

Models: ``mlp`` (the demo classifier, 2-64-64-3, batch 32), ``cnn`` (``web_cnn``: Conv,
BatchNorm, MaxPool, Gemm, batch 32) and ``lora`` (``bench_lora``'s SmolLM2-135M shape, 30
layers, LoRA r=8 on q and v, batch 4 x 128; its export must be cached: run ``bench_lora.py``
once).

Two figures per row: the mean of every step, and the median of the second half of the steps.
Chromium runs onnxruntime-web's WASM on baseline code first and swaps in optimized code as
functions get hot (about a thousand steps of the MLP); the second half is the page after that,
and what a later visit gets from the first step (the site serves the WASM revalidated, so
Chromium keeps its optimized code with it).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import web_support  # noqa: E402

from onnxblocks.runtime import TrainingSession  # noqa: E402
from onnxblocks.web import write_flat_step, write_safetensors  # noqa: E402

MODELS = ("mlp", "cnn", "lora")
#: steps per model when ``--wasm-steps`` is not given
STEPS = {"mlp": 3000, "cnn": 1500, "lora": 5}


@dataclass
class Case:
    """A model's artifacts (in the site, ``site/<name>/``) and its plan."""

    name: str
    title: str
    artifacts: Path
    batches: list[tuple[np.ndarray, ...]]
    rates: list[float]

    @property
    def steps(self) -> int:
        return len(self.rates)


def mlp_case(site: Path, steps: int) -> Case:
    from onnxblocks.web import spiral_plan

    plan = spiral_plan()
    batches = [plan.batch(i) for i in range(min(steps, plan.steps))]
    rates = [float(plan.learning_rates[i % plan.steps]) for i in range(steps)]
    write_flat_step(site / "artifacts")  # build_site writes it too: a site built before it did
    return Case(
        "artifacts", "MLP 2-64-64-3 (the demo), batch 32", site / "artifacts", batches, rates
    )


def cnn_case(site: Path, steps: int) -> Case:
    import web_cnn

    artifacts = web_cnn.write_artifacts(site / "cnn")
    write_flat_step(artifacts)
    plan = web_cnn.CnnPlan(min(steps, 300))
    batches = [plan.batch(i) for i in range(plan.steps)]
    title = f"CNN with BatchNorm (benchmarks/web_cnn.py), batch {web_cnn.BATCH}"
    return Case("cnn", title, artifacts, batches, [float(web_cnn.RATE)] * steps)


def lora_case(site: Path, steps: int) -> Case:
    import bench_lora

    import onnxblocks
    from onnxblocks import losses
    from onnxblocks.peft import LoraConfig
    from onnxblocks.web import write_state

    model = bench_lora.CACHE / "smollm2-135m-L30-v1" / "model.onnx"
    if not model.is_file():
        raise FileNotFoundError(
            f"{model} is missing: run `python benchmarks/bench_lora.py --only portable-fp32 "
            "--steps 1` once (it exports the 30-layer model into the cache)"
        )
    artifacts = site / "lora"
    onnxblocks.generate_artifacts(
        model,
        loss=losses.CrossEntropyLoss(class_axis=-1),
        optimizer=onnxblocks.OptimType.AdamW,
        artifact_directory=artifacts,
        lora=LoraConfig(
            r=bench_lora.R, lora_alpha=bench_lora.ALPHA, target_modules=bench_lora.TARGETS
        ),
        portable=True,
    )
    write_state(artifacts)
    write_flat_step(artifacts)
    title = "LoRA on SmolLM2-135M's shape (30 layers, r=8 on q and v), batch 4 x 128"
    return Case("lora", title, artifacts, [bench_lora.batch()], [bench_lora.LR] * steps)


def user_inputs(artifacts: Path) -> list[str]:
    """The step model's data inputs, in order (read from the file: no session opened)."""
    import onnx

    from onnxblocks.web import read_safetensors

    state, _ = read_safetensors(artifacts / "params.safetensors")
    graph = onnx.load(artifacts / "step_model.onnx", load_external_data=False).graph
    own = {"learning_rate", "step", *state}
    # a parameter's optimizer state is `<param>.<moment>` (params.safetensors may leave it out)
    return [
        i.name for i in graph.input if i.name not in own and i.name.rsplit(".", 1)[0] not in state
    ]


def write_plan(case: Case, path: Path) -> Path:
    """The case's plan file (as ``onnxblocks-train --plan`` and ``demo/plan.html`` read it)."""
    names = user_inputs(case.artifacts)
    tensors = {
        f"train/{i}/{name}": value
        for i, batch in enumerate(case.batches)
        for name, value in zip(names, batch, strict=True)
    }
    write_safetensors(path, tensors, {"learning_rates": json.dumps(case.rates)})
    return path


def python_steps(case: Case) -> tuple[list[float], list[float]]:
    """Python's losses and per-step seconds."""
    session = TrainingSession(case.artifacts)
    losses, seconds = [], []
    for step, rate in enumerate(case.rates):
        session.learning_rate = rate
        started = time.perf_counter()
        out = session.train_and_update(*case.batches[step % len(case.batches)])
        seconds.append(time.perf_counter() - started)
        losses.append(float(out[0]))
    del session
    return losses, seconds


def node_steps(
    js: Path, case: Case, plan: Path, flat: bool = True
) -> tuple[list[float], list[float]]:
    report = web_support.run_node(
        js, "bin/onnxblocks-train.mjs", str(case.artifacts), "--plan", str(plan),
        "--threads", str(os.cpu_count() or 1), *([] if flat else ["--no-flat"]), timeout=1800,
    )  # fmt: skip
    return report["losses"], report["stepSeconds"]


def browser_steps(
    js: Path, chromium: Path, url: str, case: Case, plan: Path, threads: int, flat: bool = True
) -> tuple[list[float], list[float], dict]:
    address = (
        f"{url}demo/plan.html?artifacts=../{case.name}/&plan=../{plan.name}&threads={threads}"
        f"&flat={int(flat)}"
    )
    report = web_support.run_node(
        js, "tools/browser-run.mjs", address, "--chromium", str(chromium), "--timeout", "1700",
        timeout=1800,
    )  # fmt: skip
    if report.get("status") != "done":
        raise RuntimeError(f"the plan page failed on {case.name}: {report.get('error')}")
    return report["losses"], report["stepSeconds"], report


def figures(seconds: list[float]) -> tuple[float, float]:
    """(mean of every step, median of the second half), seconds."""
    return statistics.fmean(seconds), statistics.median(seconds[len(seconds) // 2 :])


def table(js: Path, chromium: Path, site: Path, models: list[str], steps: int | None) -> None:
    """Train each model in Python, Node and Chromium (1 thread, every core); print its table as
    soon as it is measured (a model that fails prints why, and the next one runs).
    """
    makers = {"mlp": mlp_case, "cnn": cnn_case, "lora": lora_case}
    for model in models:
        try:
            lines = model_table(js, chromium, site, makers[model](site, steps or STEPS[model]))
        except (AssertionError, RuntimeError, OSError) as exc:
            lines = [f"{model}: failed: {str(exc)[-2000:]}", ""]
        print("\n".join(lines), flush=True)


def model_table(js: Path, chromium: Path, site: Path, case: Case) -> list[str]:
    from onnxblocks.web.server import serving

    cores = os.cpu_count() or 1
    plan = write_plan(case, site / f"{case.name}_plan.safetensors")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    reference, py = python_steps(case)
    rows = [("Python, TrainingSession (portable backend)", py, reference)]
    # a LoRA step takes seconds, its 360 carried tensors' copies milliseconds: the flat form alone
    forms = (True,) if case.name == "lora" else (False, True)
    for flat in forms:
        losses, node = node_steps(js, case, plan, flat)
        form = "flat" if flat else "step"
        rows.append((f"Node, onnxruntime-node cpu, {cores} threads, {form}", node, losses))
    with serving(site) as url:
        for threads in (1, cores):
            for flat in forms:
                losses, page, report = browser_steps(js, chromium, url, case, plan, threads, flat)
                name = (
                    f"browser, onnxruntime-web {report['onnxruntime']} WASM, "
                    f"{report['threads']} thread{'s' if report['threads'] > 1 else ''}, "
                    f"{'flat' if report.get('stepModel', '').startswith('flat') else 'step'}"
                )
                rows.append((name, page, losses))
    after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    py_mean, py_steady = figures(py)
    lines = [
        f"{case.title}, AdamW, {case.steps} steps; load average {load} before, {after} after",
        f"{'runtime':<60} {'mean ms':>9} {'x Py':>6} {'2nd half ms':>12} {'x Py':>6} "
        f"{'max rel diff':>13}",
    ]
    first = np.array(reference[:20])
    for name, seconds, losses in rows:
        mean, steady = figures(seconds)
        gap = float(np.max(np.abs(np.array(losses[:20]) - first) / np.abs(first)))
        lines.append(
            f"{name:<60} {mean * 1e3:>9.2f} {mean / py_mean:>6.2f} {steady * 1e3:>12.2f} "
            f"{steady / py_steady:>6.2f} {gap:>13.1e}"
        )
    return [*lines, ""]
