"""``onnxblocks demo --lora --web`` in headless Chromium: LoRA adapters fine-tuned by onnxruntime-web, downloaded for peft.

The site of :func:`onnxblocks.torch.lora_web.build_lora_site` (a small LLaMA pre-trained in torch on counting by
one, portable LoRA artifacts, a plan of counting-by-two batches) is served on 127.0.0.1 and driven by Debian's
Chromium with playwright-core (never a downloaded browser). Checks: the page's first 10 losses equal Python's portable
backend on the same artifacts and batches within 1e-4 relative (WASM sums in another order, and the
differences grow along the run: all 40 within 10%); the held-out loss
falls to a quarter or less and the generations after the fine-tune count by two; the adapters the page
downloads (adapter_model.safetensors + adapter_config.json) load into ``TrainingSession.load_adapters`` (the
held-out loss the page reported, within 1e-4) and into ``peft.PeftModel.from_pretrained``, whose logits are the merged
model's within 1e-5; no request leaves 127.0.0.1.

Fails, never skips, without Node, npm or Chromium (tests/support/web_support.py says how to get them).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch  # the test extra: fails, never skips, without it
from support import web_support
from support.numerics import assert_close
from support.reference64 import to64

from onnxblocks.runtime import TrainingSession
from onnxblocks.torch import (
    lora_demo,
    lora_web,
)  # the test extra (torch==2.13.0): fails, never skips, without it
from onnxblocks.web import read_safetensors
from onnxblocks.web.server import serving

STEPS = 40


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """``(site, report, downloaded adapters directory)`` of one run of the page."""
    try:
        js, chromium = (
            web_support.workspace(tmp_path_factory.mktemp("client")),
            web_support.chromium(),
        )
    except web_support.WebEnvError as exc:
        pytest.fail(str(exc))
    site = lora_web.build_lora_site(tmp_path_factory.mktemp("site"), steps=STEPS)
    downloads = tmp_path_factory.mktemp("downloads")
    with serving(site) as url:
        report = web_support.run_node(
            js, "tools/browser-run.mjs", url + "demo/lora.html", "--adapters", str(downloads),
            "--chromium", str(chromium), "--timeout", "600", timeout=900,
        )  # fmt: skip
    assert report["status"] == "done", report.get("error")
    return site, report, downloads


def _python_run(site):
    session = TrainingSession(site / lora_web.LORA_ARTIFACTS)
    plan, metadata = read_safetensors(site / lora_web.LORA_PLAN)
    ids, labels = session.input_names
    session.learning_rate = float(metadata["learning_rate"])
    losses = [
        float(session.train_and_update(plan[f"train/{i}/{ids}"], plan[f"train/{i}/{labels}"])[0])
        for i in range(STEPS)
    ]
    return session, losses


def test_the_page_fine_tunes_the_adapters_as_python_does(page):
    site, report, _ = page
    assert not report["offOrigin"] and not [
        m for m in report["console"] if m.startswith("pageerror")
    ]
    assert report["steps"] == STEPS
    _, python = _python_run(site)
    # the first steps agree closely; float differences then grow along the run (WASM and CPU sum in other orders)
    # (two float32 clients of ours: no float64 truth, the floor from the losses' size)
    page_losses, python = np.float32(report["losses"]), np.float32(python)
    assert_close(page_losses[:10], python[:10], rtol=1e-4, name="the first 10 losses")
    assert_close(page_losses, python, rtol=0.1, name="every loss")
    assert report["lossAfter"] <= 0.25 * report["lossBefore"]
    counted = lora_demo._fraction(report["prompts"], report["after"], lora_demo.FINETUNE_STRIDE)
    before = lora_demo._fraction(report["prompts"], report["before"], lora_demo.PRETRAIN_STRIDE)
    assert (
        counted >= 0.9 and before >= 0.9
    )  # the base counts by one, the fine-tuned adapters by two


def test_the_downloaded_adapters_load_into_python_and_peft(page, tmp_path):
    import onnxruntime as ort
    import peft  # the test extra: fails, never skips, without it
    import transformers

    site, report, downloads = page
    assert report["adapterFiles"] == ["adapter_config.json", "adapter_model.safetensors"]
    session = TrainingSession(site / lora_web.LORA_ARTIFACTS)
    session.load_adapters(downloads)
    plan, _ = read_safetensors(site / lora_web.LORA_PLAN)
    ids, labels = (plan[f"held_out/{n}"] for n in session.input_names)
    held_out = float(session.eval_step(ids, labels)[0])  # the page's adapters, evaluated by Python
    assert_close(
        np.float32(held_out), np.float32(report["lossAfter"]), rtol=1e-4, name="held-out loss"
    )
    merged = session.export_inference_model(
        tmp_path / "merged.onnx", ["logits"], merge_adapters=True
    )

    lm = lora_demo.build_llama(0)
    weights, _ = read_safetensors(site / lora_web.BASE_WEIGHTS)
    lm.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    assert isinstance(lm, transformers.LlamaForCausalLM)
    loaded = peft.PeftModel.from_pretrained(lm, downloads).eval()
    ours = ort.InferenceSession(os.fspath(merged), providers=["CPUExecutionProvider"]).run(
        ["logits"], {"input_ids": ids}
    )[0]
    with torch.no_grad():
        theirs = loaded(input_ids=torch.from_numpy(ids)).logits.numpy()
        theirs64 = to64(loaded)(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert_close(ours, theirs, theirs64, rtol=1e-5, name="logits against PEFT")
