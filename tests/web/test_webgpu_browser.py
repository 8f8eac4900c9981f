"""The demo page on WebGPU in headless Chromium, and the cross-origin isolation that gives WASM threads.

The site ``build_site`` writes is served by ``onnxblocks.web.server`` and driven with
playwright-core in Debian's Chromium with ``--enable-unsafe-webgpu`` (SwiftShader's WebGPU
adapter, no GPU needed). On ``?ep=webgpu``, with onnxruntime-web's default bundle and with its
``/webgpu`` bundle, the page trains 3 epochs (peak rate 0.02) to the demo's validation accuracy,
its first 10 losses within 1e-5 relative of the same page on WASM, every ``Gemm`` of the step
model on the WebGPU provider, its status line naming the provider. The server sends COOP and COEP,
so the page is ``crossOriginIsolated`` and its WASM runs on every core. The LoRA page on WebGPU
(both bundles; a small LLaMA, 16 adapter tensors) takes 5 steps within 1e-4 relative of Python's
portable backend, every ``MatMul`` and ``Gemm`` on the GPU; on ``/webgpu`` this needs the eval
model free of float64 (``onnxblocks.portable.float64``).

Fails, never skips, without Node, npm or Chromium (tests/support/web_support.py says how to get them).
"""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
from support import web_support
from support.numerics import assert_close

from onnxblocks.demo import TARGET_ACCURACY
from onnxblocks.runtime import TrainingSession
from onnxblocks.web import build_site, read_safetensors
from onnxblocks.web.server import serving

#: WebGPU and WASM are two float32 runs of one graph: no float64 truth, rtol and the floor from the size
PARITY_STEPS, RTOL = 10, 1e-5
SCHEDULE = "epochs=3&lr=0.02&grid=8"
#: the provider name of each bundle's WebGPU backend in ONNX Runtime's log
GPU_PROVIDER = {"default": "JsExecutionProvider", "webgpu": "WebGpuExecutionProvider"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    try:
        js, chromium = (
            web_support.workspace(tmp_path_factory.mktemp("client")),
            web_support.chromium(),
        )
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))
    root = build_site(tmp_path_factory.mktemp("site"))
    with serving(root) as url:
        yield js, chromium, url


def _page(site, query: str) -> dict:
    js, chromium, url = site
    return web_support.run_node(
        js, "tools/browser-run.mjs", f"{url}demo/?{query}",
        "--chromium", str(chromium), "--timeout", "400", timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def wasm(site):
    return _page(site, f"{SCHEDULE}&steps={PARITY_STEPS}")


@pytest.fixture(scope="module", params=["default", "webgpu"])
def webgpu(site, request):
    return request.param, _page(site, f"ep=webgpu&bundle={request.param}&{SCHEDULE}")


def test_the_server_isolates_the_page_and_wasm_uses_threads(site, wasm):
    _, _, url = site
    with urllib.request.urlopen(f"{url}demo/index.html") as response:
        assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert response.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert wasm["status"] == "done", wasm["error"]
    assert wasm["crossOriginIsolated"] is True and wasm["ep"] == "wasm"
    assert wasm["threads"] >= 1 and f"WASM threads {wasm['threads']}" in wasm["runtimeShown"]
    assert "crossOriginIsolated true" in wasm["runtimeShown"]
    assert wasm["shown"][-1].startswith("onnxruntime-web 1.30.0 (wasm)")
    assert list(wasm["placement"]) == ["CPUExecutionProvider"]


def test_webgpu_trains_to_the_demo_accuracy_as_wasm_does(webgpu, wasm):
    bundle, page = webgpu
    assert page["status"] == "done", page["error"]
    assert (page["ep"], page["bundle"]) == ("webgpu", bundle)
    assert page["shown"][-1].startswith("onnxruntime-web 1.30.0 (webgpu)")
    assert [line for line in page["console"] if line.startswith(("error", "pageerror"))] == []
    assert page["offOrigin"] == []
    assert page["valAccuracy"][-1] >= TARGET_ACCURACY
    assert_close(
        np.float32(page["losses"][:PARITY_STEPS]),
        np.float32(wasm["losses"]),
        rtol=RTOL,
        name=f"losses on webgpu ({bundle} bundle) against wasm",
    )


def test_every_gemm_of_the_step_runs_on_the_gpu(webgpu):
    bundle, page = webgpu
    placement = page["placement"]
    gpu, cpu = placement[GPU_PROVIDER[bundle]], placement["CPUExecutionProvider"]
    # three layers forward; each weight's gradient and, but for the first, the input's
    assert gpu["ops"]["Gemm"] == 3 + 3 + 2 and "Gemm" not in cpu["ops"]
    assert sum(gpu["ops"].values()) == gpu["nodes"] > cpu["nodes"] == sum(cpu["ops"].values())


LORA_STEPS = 5


@pytest.fixture(scope="module")
def lora_site(tmp_path_factory):
    """The LoRA page's site, built once for both bundles (the bundle is a query parameter)."""
    from onnxblocks.torch import lora_web  # the test extra (torch): fails, never skips, without it

    root = tmp_path_factory.mktemp("lora") / "lora"
    return lora_web.build_lora_site(root, steps=LORA_STEPS, pretrain_steps=5)


@pytest.mark.parametrize("bundle", ["default", "webgpu"])
def test_the_lora_page_on_webgpu_fine_tunes_as_python_does(site, lora_site, bundle):
    from onnxblocks.torch import lora_web

    js, chromium, _ = site
    steps, root = LORA_STEPS, lora_site
    with serving(root) as url:
        page = web_support.run_node(
            js, "tools/browser-run.mjs",
            f"{url}demo/lora.html?ep=webgpu&bundle={bundle}&placement=1",
            "--chromium", str(chromium), "--timeout", "400", timeout=600,
        )  # fmt: skip
    assert page["status"] == "done", page["error"]
    assert [line for line in page["console"] if line.startswith(("error", "pageerror"))] == []
    session = TrainingSession(root / lora_web.LORA_ARTIFACTS)
    plan, metadata = read_safetensors(root / lora_web.LORA_PLAN)
    ids, labels = session.input_names
    session.learning_rate = float(metadata["learning_rate"])
    python = [
        float(session.train_and_update(plan[f"train/{i}/{ids}"], plan[f"train/{i}/{labels}"])[0])
        for i in range(steps)
    ]
    # two float32 clients of ours: no float64 truth, the floor from the losses' size
    assert_close(
        np.float32(page["losses"]),
        np.float32(python),
        rtol=1e-4,
        name=f"LoRA losses on webgpu ({bundle} bundle)",
    )
    placement = page["placement"]
    gpu, cpu = placement[GPU_PROVIDER[bundle]], placement["CPUExecutionProvider"]
    assert gpu["ops"]["MatMul"] > 0 and "MatMul" not in cpu["ops"] and "Gemm" not in cpu["ops"]
