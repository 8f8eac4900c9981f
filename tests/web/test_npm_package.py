"""The npm package in ``js/``: ``npm test``, ``npm pack`` into an empty project, its README example, ``tsc --strict``.

* ``npm test`` (``node --test test/``) passes in a copy of the client;
* the ``npm pack`` tarball (its ``prepack`` writes the ``.d.mts`` declarations from the
  JSDoc) installs into an empty project with only ``onnxruntime-node`` beside it, and
  brings no ``onnxruntime-web`` (both are optional peer dependencies);
* the README's example, copied verbatim, runs there under Node on the demo's artifacts:
  the loss falls, the state it saves resumes in Python with the eval loss it printed,
  and the ``.onnx`` it exports runs in ``onnxruntime.InferenceSession`` with its logits;
* a small TypeScript consumer that imports the package passes ``tsc --strict``
  (no ``skipLibCheck``: the generated declarations are checked too).

Fails, never skips, without Node and npm (tests/support/web_support.py says how to get them).
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnxruntime
import pytest
from support import web_support
from support.numerics import assert_close

from onnxblocks.runtime import TrainingSession
from onnxblocks.web import load_state, spiral_artifacts
from onnxblocks.web.npm import ORT_WEB_VERSION, js_dir

CONSUMER_TS = """\
import { exportInferenceModel, loadTrainer, ort, writeState, Trainer, type TrainingState } from 'onnxblocks-train';
import { fillInferenceModel, type TemplateLayout } from 'onnxblocks-train/inference';

const trainer: Trainer = await loadTrainer('artifacts', { evaluate: false });
const [features, labels] = trainer.inputNames;
const x = new ort.Tensor('float32', new Float32Array(4), [2, 2]);
const y = { dtype: 'int64' as const, shape: [2], data: new BigInt64Array(2) };
const { loss } = await trainer.trainStep({ [features]: x, [labels]: y }, 0.01);
const state: TrainingState = await trainer.state();
const step: number = state.step + loss;
await writeState('state.safetensors', state);
const written: string = await exportInferenceModel('artifacts', trainer, 'model.onnx');
const layout: TemplateLayout | undefined = undefined;
console.log(step, written, layout, typeof fillInferenceModel);
"""


def _run(argv: list[str], cwd, timeout: float = 600) -> str:
    env = {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip", "npm_config_update_notifier": "false"}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    try:
        return web_support.workspace(tmp_path_factory.mktemp("client"))
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))


def test_npm_test_passes(client):
    out = _run(["npm", "test"], client)
    assert "# fail 0" in out and "# pass " in out


@pytest.fixture(scope="module")
def consumer(client, tmp_path_factory):
    """An empty project with the packed package and onnxruntime-node installed, and the demo's artifacts."""
    packs = tmp_path_factory.mktemp("pack")
    _run(["npm", "pack", "--pack-destination", str(packs), "--loglevel=error"], client)
    (tarball,) = packs.glob("onnxblocks-train-*.tgz")
    project = tmp_path_factory.mktemp("consumer")
    (project / "package.json").write_text(
        json.dumps({"name": "consumer", "private": True, "type": "module"})
    )
    install = ["npm", "install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"]
    _run([*install, str(tarball), f"onnxruntime-node@{ORT_WEB_VERSION}"], project)
    spiral_artifacts(project / "artifacts")
    return project


def test_the_packed_package_installs_with_only_onnxruntime_node(consumer):
    modules = consumer / "node_modules"
    assert (modules / "onnxblocks-train" / "types" / "node.d.mts").is_file()
    assert (modules / "onnxruntime-node").is_dir() and not (modules / "onnxruntime-web").exists()
    manifest = json.loads((modules / "onnxblocks-train" / "package.json").read_text())
    assert "private" not in manifest and "dependencies" not in manifest
    assert set(manifest["peerDependencies"]) == {"onnxruntime-node", "onnxruntime-web"}


def _toy_batch(n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    """The README example's batch, computed as it computes it (float64 maths, stored as float32)."""
    i = np.arange(n)
    label = i % 3
    x = np.stack(
        [
            np.cos(2 * np.pi * label / 3) + 0.1 * np.sin(i),
            np.sin(2 * np.pi * label / 3) + 0.1 * np.cos(i),
        ],
        axis=1,
    ).astype(np.float32)
    return x, label.astype(np.int64)


def test_the_readme_example_runs_and_its_results_load_in_python(consumer):
    readme = (js_dir() / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- example:start -->")[1].split("<!-- example:end -->")[0]
    code = block.split("```js\n", 1)[1].rsplit("```", 1)[0]
    (consumer / "example.mjs").write_text(code, encoding="utf-8")
    report = json.loads(_run(["node", "example.mjs"], consumer).strip().splitlines()[-1])
    assert report["last"] < 0.5 * report["first"]
    x, y = _toy_batch()
    session = onnxruntime.InferenceSession(
        str(consumer / "trained.onnx"), providers=["CPUExecutionProvider"]
    )
    (logits,) = session.run(None, {session.get_inputs()[0].name: x})
    # JavaScript against Python, both float32 of ours: no float64 truth, the floor from the logits' size
    assert_close(logits.reshape(-1)[:6], np.float32(report["logits"]), rtol=1e-5, name="logits")
    training = TrainingSession(consumer / "artifacts")
    load_state(training, consumer / "trained.safetensors")
    loss, _ = training.eval_step(x, y)
    assert_close(loss, np.float32(report["evalLoss"]), rtol=1e-5, name="eval loss")


def test_a_typescript_consumer_passes_tsc_strict(client, consumer):
    (consumer / "consumer.ts").write_text(CONSUMER_TS, encoding="utf-8")
    options = {
        "strict": True,
        "noEmit": True,
        "target": "ES2022",
        "module": "NodeNext",
        "moduleResolution": "NodeNext",
    }
    (consumer / "tsconfig.json").write_text(
        json.dumps({"compilerOptions": {**options, "types": []}, "files": ["consumer.ts"]})
    )
    tsc = client / "node_modules" / "typescript" / "bin" / "tsc"
    _run(["node", str(tsc), "-p", "tsconfig.json"], consumer)
