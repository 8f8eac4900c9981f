"""Where the JavaScript side comes from: the client in ``js/`` and npm packages installed once into
a cache.

* :func:`js_dir`: the JavaScript client: ``$ONNXBLOCKS_JS_DIR``, else ``js/`` of a source checkout,
  else the copy an installed wheel carries (``onnxblocks/web/js``: ``package.json``, ``src/``,
  ``demo/``).
* :func:`install_js_dependencies`: ``npm ci`` of the client's ``package.json`` and lock file
  (onnxruntime-node, onnxruntime-web, playwright-core, typescript) into
  ``<cache>/npm-<hash>/node_modules``, once per lock file. The tests use it.
* :func:`onnxruntime_web_dist`: the ``dist/`` folder of ``onnxruntime-web`` for the browser
  demo: ``$ONNXBLOCKS_ORT_WEB_DIST`` when set (an offline machine), else
  ``npm install onnxruntime-web@`` :data:`ORT_WEB_VERSION` into
  ``<cache>/onnxruntime-web-<version>``
  once (needs npm and the npm registry the first time, nothing after).

The cache is ``$ONNXBLOCKS_CACHE``, else ``$XDG_CACHE_HOME/onnxblocks``, else
``~/.cache/onnxblocks``. Installs happen in a temporary folder renamed into place,
so a half-finished install is never used. onnxruntime-node's install script,
which downloads CUDA binaries from nuget.org on Linux x64, is told to skip
(``ONNXRUNTIME_NODE_INSTALL=skip``): the CPU binaries ship in the npm package.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from onnxblocks._core.errors import NpmError

#: The onnxruntime-web (and onnxruntime-node) version the client pins (``js/package.json``; a test
#: checks).
ORT_WEB_VERSION = "1.30.0"
#: The client's files that decide its npm install.
_LOCK_FILES = ("package.json", "package-lock.json", ".npmrc")


def cache_root() -> Path:
    """The onnxblocks cache: ``$ONNXBLOCKS_CACHE``, ``$XDG_CACHE_HOME/onnxblocks`` or
    ``~/.cache/onnxblocks``.
    """
    if os.environ.get("ONNXBLOCKS_CACHE"):
        return Path(os.environ["ONNXBLOCKS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onnxblocks"


def js_dir() -> Path:
    """The JavaScript client's folder (``package.json``, ``src/``, ``demo/``).

    Raises:
        NpmError: when it cannot be found (an installed wheel has no ``js/``).
    """
    candidates = (
        [Path(os.environ["ONNXBLOCKS_JS_DIR"])] if os.environ.get("ONNXBLOCKS_JS_DIR") else []
    )
    candidates.append(Path(__file__).resolve().parents[2] / "js")  # a source checkout
    candidates.append(Path(__file__).resolve().parent / "js")  # the copy a wheel carries (setup.py)
    for candidate in candidates:
        if (candidate / "package.json").is_file() and (candidate / "src" / "trainer.mjs").is_file():
            return candidate
    raise NpmError(
        f"The JavaScript client is not at {', '.join(map(str, candidates))}. A wheel carries it in "
        "onnxblocks/web/js: reinstall onnxblocks from a wheel built with its setup.py (pip "
        "install onnxblocks), "
        "install it from a clone (pip install -e .), or point $ONNXBLOCKS_JS_DIR at js/ of the "
        "source checkout."
    )


def npm_executable() -> str:
    """The ``npm`` on the PATH.

    Raises:
        NpmError: when there is none, with how to get it.
    """
    found = shutil.which("npm")
    if found is None:
        raise NpmError(
            "npm is not on the PATH. Install Node.js 20 or newer with npm (e.g. `apt-get install "
            "nodejs npm`, or "
            "https://nodejs.org), then run the command again."
        )
    return found


def _env() -> dict[str, str]:
    return {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip", "npm_config_update_notifier": "false"}


def _install(
    target: Path, files: dict[str, bytes], command: Sequence[str], what: str, timeout: float
) -> Path:
    """Run ``npm <command>`` in a staging folder holding ``files``; rename it to ``target``;
    return node_modules.
    """
    modules = target / "node_modules"
    if (target / "ready").exists() and modules.is_dir():
        return modules
    npm = npm_executable()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        argv = [npm, *command, "--no-audit", "--no-fund", "--loglevel=error"]
        try:
            done = subprocess.run(
                argv,
                cwd=staging,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise NpmError(
                f"{what}: `{' '.join(argv)}` did not finish in {timeout:.0f} s."
            ) from None
        if done.returncode != 0:
            raise NpmError(
                f"{what}: `{' '.join(argv)}` failed (exit {done.returncode}); it needs the npm "
                "registry the first "
                f"time.\n{(done.stderr or done.stdout)[-3000:]}"
            )
        (staging / "ready").write_text("ok\n")
        try:
            staging.rename(target)
        except OSError:  # another process finished first: use its install
            if not (target / "ready").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return modules


def install_js_dependencies(cache: str | os.PathLike | None = None, timeout: float = 900) -> Path:
    """``npm ci`` the JavaScript client's dependencies into the cache, once per lock file.

    Args:
        cache: The cache folder (default :func:`cache_root`); the install goes to its
        ``npm-<hash>``.
        timeout: Seconds the install may take.

    Returns:
        The ``node_modules`` folder.

    Raises:
        NpmError: without npm, the client, or the npm registry on the first call.
    """
    source = js_dir()
    files = {name: (source / name).read_bytes() for name in _LOCK_FILES if (source / name).exists()}
    key = hashlib.sha256(
        b"".join(n.encode() + b"\0" + d + b"\0" for n, d in files.items())
    ).hexdigest()[:16]
    root = Path(os.fspath(cache)) if cache is not None else cache_root()
    return _install(
        root / f"npm-{key}", files, ["ci"], "Installing the JavaScript client's packages", timeout
    )


def onnxruntime_web_dist(timeout: float = 900) -> Path:
    """The ``dist/`` folder of onnxruntime-web :data:`ORT_WEB_VERSION`, installed into the cache on
    first use.

    ``$ONNXBLOCKS_ORT_WEB_DIST`` overrides it (a ``dist/`` folder copied from any
    install of that version, for a machine without the npm registry).

    Raises:
        NpmError: without npm or the registry on first use, or when the folder lacks the WASM files.
    """
    if os.environ.get("ONNXBLOCKS_ORT_WEB_DIST"):
        dist = Path(os.environ["ONNXBLOCKS_ORT_WEB_DIST"])
        where = "$ONNXBLOCKS_ORT_WEB_DIST"
    else:
        package = json.dumps(
            {"private": True, "dependencies": {"onnxruntime-web": ORT_WEB_VERSION}}
        ).encode()
        modules = _install(
            cache_root() / f"onnxruntime-web-{ORT_WEB_VERSION}",
            {"package.json": package},
            ["install"],
            f"Installing onnxruntime-web {ORT_WEB_VERSION} for the browser demo",
            timeout,
        )
        dist = modules / "onnxruntime-web" / "dist"
        where = "the npm install"
    missing = [
        name for name in (*WASM_RUNTIME_FILES, *WEBGPU_RUNTIME_FILES) if not (dist / name).is_file()
    ]
    if missing:
        raise NpmError(
            f"{where} ({dist}) lacks {', '.join(missing)}: point it at onnxruntime-web's dist/ "
            "folder."
        )
    return dist


#: The files of onnxruntime-web's WASM backend the page loads (served from the page's own origin).
WASM_RUNTIME_FILES = (
    "ort.wasm.min.mjs",
    "ort-wasm-simd-threaded.mjs",
    "ort-wasm-simd-threaded.wasm",
)

#: The two bundles with a WebGPU backend and the WASM build each loads: the default one
#: (``onnxruntime-web``, JavaScript WebGPU kernels) and ``onnxruntime-web/webgpu`` (the native
#: WebGPU provider). The pages pick one with ``?ep=webgpu`` and ``&bundle=`` (docs/web.md).
WEBGPU_RUNTIME_FILES = (
    "ort.min.mjs",
    "ort-wasm-simd-threaded.jsep.mjs",
    "ort-wasm-simd-threaded.jsep.wasm",
    "ort.webgpu.min.mjs",
    "ort-wasm-simd-threaded.asyncify.mjs",
    "ort-wasm-simd-threaded.asyncify.wasm",
)
