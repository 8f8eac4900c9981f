"""Transformers.js (npm ``@huggingface/transformers``) for the hub tests, installed once into the cache.

``transformers_js()`` gives a folder whose ``node_modules`` holds the pinned release, installed with
``npm install`` into ``~/.cache/onnxblocks-test/transformersjs-<hash>`` under
:func:`support.cache_lock.cache_lock` (staging folder renamed into place). The install runs with
``ONNXRUNTIME_NODE_INSTALL=skip`` and ``--ignore-scripts``: onnxruntime-node's post-install fetches
GPU binaries where it can, and its CPU binary ships in the package itself (checked here).
``run_generate`` runs ``tests/hub/tjs_generate.mjs`` in Node (or ``tjs_browser.mjs`` in headless
Chromium) and returns the generated tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from support import venvs
from support.cache_lock import cache_dir
from support.json_child import json_answer

#: The release the tests load models with (Transformers.js 4.3.x).
PACKAGE = "@huggingface/transformers@4.3.2"
SCRIPT = Path(__file__).resolve().parent.parent / "hub" / "tjs_generate.mjs"
BROWSER_SCRIPT = SCRIPT.with_name("tjs_browser.mjs")


class TransformersJsError(RuntimeError):
    """Node, npm or the package cannot be had; the message says what to run."""


def transformers_js() -> Path:
    """The folder with ``node_modules/@huggingface/transformers`` (installed on first use)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise TransformersJsError(
            "Node.js 20+ with npm is needed for the Transformers.js tests (apt-get install nodejs npm)."
        )
    key = hashlib.sha256(PACKAGE.encode()).hexdigest()[:16]
    folder = cache_dir() / f"transformersjs-{key}"
    return venvs.cached_dir(folder, _install)


def _install(staging: Path) -> str:
    (staging / "package.json").write_text(
        json.dumps({"name": "onnxblocks-tjs-tests", "private": True, "type": "module"})
    )
    command = ["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", PACKAGE]
    what = f"npm installing {PACKAGE} (by hand: ONNXRUNTIME_NODE_INSTALL=skip, in {staging.parent})"
    env = {"ONNXRUNTIME_NODE_INSTALL": "skip"}
    venvs.run(command, what, TransformersJsError, cwd=staging, env=env)
    binding = list(
        (staging / "node_modules" / "onnxruntime-node" / "bin").glob(
            "napi-v*/linux/x64/onnxruntime_binding.node"
        )
    )
    if not binding:
        raise TransformersJsError(
            f"onnxruntime-node in {staging} has no CPU binary for linux/x64; install it by hand "
            "(npm install onnxruntime-node@1.30.0 without ONNXRUNTIME_NODE_INSTALL=skip)."
        )
    return PACKAGE


def run_generate(
    root: Path, model: str, dtype: str, prompt: list[int], steps: int, *, browser: bool = False
) -> list[int]:
    """Greedy tokens Transformers.js generates from ``root/model`` (local files only): in Node, or
    with ``browser`` in headless Chromium (``tests/hub/tjs_browser.mjs``: the folder served on
    127.0.0.1, driven by the client's playwright-core, every request off the page's origin
    aborted).
    """
    folder = transformers_js()
    request = json.dumps(
        {"root": os.fspath(root), "model": model, "dtype": dtype, "prompt": prompt, "steps": steps}
    )
    env = {**os.environ, "NODE_PATH": os.fspath(folder / "node_modules")}
    if browser:
        from support import web_support

        command = [
            "node", os.fspath(BROWSER_SCRIPT), request, os.fspath(folder / "node_modules"),
            os.fspath(web_support.node_modules()), os.fspath(web_support.chromium()),
        ]  # fmt: skip
    else:
        command = ["node", os.fspath(SCRIPT), request]
    result = json_answer(command, " ".join(command[:2]), cwd=folder, env=env, timeout=600)
    assert "tokens" in result, (
        f"Transformers.js failed: {result.get('error')} {result.get('console')}"
    )
    assert not result.get("offOrigin"), f"the page reached off its origin: {result['offOrigin']}"
    return result["tokens"]
