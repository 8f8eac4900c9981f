"""The JavaScript client on onnxruntime-node's webgpu provider against its CPU provider.

``onnxblocks-train --ep webgpu`` trains the demo's portable artifacts 10 steps on the same
batches as ``--ep cpu``: the losses agree within 1e-5 relative, and ``--placement`` reports
every ``Gemm`` (forward and gradient) on ``WebGpuExecutionProvider``. Without a GPU the provider
runs on Vulkan SwiftShader from Debian's chromium package (``support.web_support.swiftshader_env``).

Fails, never skips, without Node, the client's npm packages or chromium.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import web_support
from support.numerics import assert_close

from onnxblocks.runtime import TrainingSession
from onnxblocks.web import spiral_artifacts, spiral_plan
from onnxblocks.web import write_safetensors as write_plan

#: two float32 clients of ours on two providers: no float64 truth, rtol and the floor from the size
STEPS, LR, RTOL = 10, 0.01, 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    try:
        js = web_support.workspace(tmp_path_factory.mktemp("client"))
        env = web_support.swiftshader_env()
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))
    root = tmp_path_factory.mktemp("webgpu")
    directory = spiral_artifacts(root / "artifacts")
    plan = spiral_plan(epochs=1)
    names = TrainingSession(directory).input_names
    write_plan(
        root / "plan.safetensors",
        {
            f"train/{i}/{n}": v
            for i in range(STEPS)
            for n, v in zip(names, plan.batch(i), strict=True)
        },
    )
    reports = {}
    for ep in ("cpu", "webgpu"):
        reports[ep] = web_support.run_node(
            js,
            "bin/onnxblocks-train.mjs",
            str(directory),
            "--plan", str(root / "plan.safetensors"),
            "--steps", str(STEPS),
            "--lr", str(LR),
            "--ep", ep,
            "--placement",
            env=env,
        )  # fmt: skip
    return reports


def test_webgpu_losses_equal_cpu_step_by_step(runs):
    cpu, gpu = (np.float32(runs[ep]["losses"]) for ep in ("cpu", "webgpu"))
    assert gpu.shape == (STEPS,)
    assert_close(gpu, cpu, rtol=RTOL, name="webgpu against cpu")
    assert runs["webgpu"]["executionProviders"] == ["webgpu", "cpu"]


def test_placement_puts_every_gemm_on_the_gpu(runs):
    assert list(runs["cpu"]["placement"]) == ["CPUExecutionProvider"]
    placement = runs["webgpu"]["placement"]
    gpu, cpu = placement["WebGpuExecutionProvider"], placement["CPUExecutionProvider"]
    # three layers forward; each weight's gradient and, but for the first, the input's
    assert gpu["ops"]["Gemm"] == 3 + 3 + 2
    assert "Gemm" not in cpu["ops"] and sum(cpu["ops"].values()) == cpu["nodes"]
    assert sum(gpu["ops"].values()) == gpu["nodes"] > cpu["nodes"]
