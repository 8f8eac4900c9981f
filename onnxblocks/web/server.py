"""Serving a folder on 127.0.0.1 with the MIME types a page that runs WebAssembly needs."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onnxblocks._core.errors import NotAFolderError

#: Types browsers insist on: module scripts must be JavaScript, ``WebAssembly.instantiateStreaming``
#: needs wasm.
MIME_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".onnx": "application/octet-stream",
    ".safetensors": "application/octet-stream",
    ".map": "application/json",
}

#: Headers that make the page ``crossOriginIsolated`` (the page then has ``SharedArrayBuffer`` and
#: onnxruntime-web's WASM backend can use ``ort.env.wasm.numThreads`` > 1). Every file is served
#: from this one origin, so ``require-corp`` blocks nothing the pages load.
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}


#: The folder of onnxruntime-web's runtime files in a site (``site.copy_client``).
RUNTIME_FOLDER = "/ort/"


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}  # noqa: RUF012 - never mutated

    def end_headers(self) -> None:
        if self.path.startswith(RUNTIME_FOLDER):
            # kept and revalidated (Last-Modified, 304): Chromium then keeps the optimized code it
            # compiled from onnxruntime-web's WASM with the file, and a later visit trains at full
            # speed from the first step instead of after about a thousand steps on baseline code
            self.send_header("Cache-Control", "no-cache")
        else:
            # a rebuilt site is never mixed with a cached one
            self.send_header("Cache-Control", "no-store")
        # cross-origin isolation: SharedArrayBuffer, so onnxruntime-web's WASM runs on threads
        for name, value in ISOLATION_HEADERS.items():
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the CLI prints the URL
        pass


def serve(
    directory: str | os.PathLike, port: int = 0, host: str = "127.0.0.1"
) -> http.server.ThreadingHTTPServer:
    """A threading HTTP server of ``directory`` (not started: call ``serve_forever``).

    Args:
        directory: The folder to serve.
        port: The port; 0 picks a free one (read it from ``server.server_address``).
        host: The address to bind; the default keeps the page on this machine.

    Raises:
        NotADirectoryError: if ``directory`` is not a folder.
        OSError: if the port is taken.
    """
    root = Path(os.fspath(directory))
    if not root.is_dir():
        raise NotAFolderError(
            f"Cannot serve '{root}': not a directory. Build the site first (build_site)."
        )
    handler = functools.partial(_Handler, directory=os.fspath(root))
    return http.server.ThreadingHTTPServer((host, port), handler)


def url_of(server: http.server.HTTPServer, path: str = "") -> str:
    """The ``http://host:port/path`` of a server."""
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}/{path}"


@contextlib.contextmanager
def serving(directory: str | os.PathLike, port: int = 0) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 in a background thread; yield its URL; stop on exit."""
    server = serve(directory, port)
    thread = threading.Thread(
        target=server.serve_forever, name="onnxblocks-web-server", daemon=True
    )
    thread.start()
    try:
        yield url_of(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
