"""What the JavaScript tests need: Node, the client's npm packages (cached), system Chromium, and runners.

Everything is set up on first use and cached; what cannot be had raises
:class:`WebEnvError` with what to install (the tests turn it into a failure,
never a skip):

* the client's packages: ``npm ci`` of ``js/package.json`` + lock into
  ``~/.cache/onnxblocks-test/npm-<hash of the lock files>`` (``$XDG_CACHE_HOME`` respected);
* Chromium: ``/usr/bin/chromium`` (Debian's package), installed with
  ``apt-get install -y chromium`` when missing and running as root. Never a downloaded browser.

The client's files are copied into a per-test folder next to a ``node_modules`` link to the
cache, so Node resolves ``onnxruntime-node`` and ``playwright-core`` from there and the
checkout's ``js/`` is never written to.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from onnxblocks.web.npm import NpmError, install_js_dependencies, js_dir
from support.cache_lock import cache_dir, cache_lock
from support.json_child import json_answer
from support.system_tools import SystemToolError, debian_tool

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


class WebEnvError(RuntimeError):
    """Node, npm or Chromium cannot be had."""


@functools.cache
def node_modules() -> Path:
    """The client's ``node_modules`` (npm-installed into the test cache once per lock file)."""
    if shutil.which("node") is None:
        raise WebEnvError(
            "Node.js is not on the PATH; the JavaScript tests need Node 20+ with npm (apt-get install nodejs npm)."
        )
    try:
        with cache_lock("npm"):  # one npm ci per lock file, however many workers ask at once
            return install_js_dependencies(cache=cache_dir())
    except NpmError as exc:
        raise WebEnvError(str(exc)) from None


def workspace(directory: Path) -> Path:
    """A copy of the client (src, bin, tools, demo, test, package files) in ``directory/js``, ``node_modules`` linked."""
    source, target = js_dir(), directory / "js"
    for sub in ("src", "bin", "tools", "demo", "test"):
        shutil.copytree(source / sub, target / sub)
    for name in (
        "package.json",
        "package-lock.json",
        "jsconfig.json",
        "tsconfig.types.json",
        "README.md",
        ".npmrc",
    ):
        shutil.copyfile(source / name, target / name)
    (target / "node_modules").symlink_to(node_modules(), target_is_directory=True)
    return target


@functools.cache
def chromium() -> Path:
    """Debian's Chromium, installed with apt-get when missing (as root)."""
    try:
        return debian_tool(
            "chromium",
            CHROMIUM_CANDIDATES,
            "the browser test drives it with playwright-core; it never downloads one",
        )
    except SystemToolError as exc:
        raise WebEnvError(str(exc)) from None


def swiftshader_env() -> dict[str, str]:
    """The environment that gives onnxruntime-node's webgpu provider a Vulkan adapter without a GPU.

    Debian's Chromium ships SwiftShader (Vulkan on the CPU) and a Vulkan loader in its library
    folder; the variables point the loader of onnxruntime-node's Dawn at them.
    """
    chromium()  # installed when missing
    for folder in (Path("/usr/lib/chromium"), Path("/usr/lib64/chromium")):
        icd = folder / "vk_swiftshader_icd.json"
        if icd.is_file() and (folder / "libvk_swiftshader.so").is_file():
            return {**os.environ, "LD_LIBRARY_PATH": str(folder), "VK_ICD_FILENAMES": str(icd)}
    raise WebEnvError(
        "no vk_swiftshader_icd.json in /usr/lib/chromium: the webgpu tests need Debian's chromium "
        "package (apt-get install -y chromium), or a Vulkan driver (mesa-vulkan-drivers, libvulkan1)"
    )


def run_node(
    js: Path, script: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> dict:
    """Run ``node js/<script> args`` (in ``env``, default this one) and return the JSON line it prints.

    Raises:
        AssertionError: when it fails, with its error output.
    """
    cmd = ["node", str(js / script), *args]
    return json_answer(cmd, f"node {script}", cwd=js, env=env, timeout=timeout)
