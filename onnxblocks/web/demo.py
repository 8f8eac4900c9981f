"""``onnxblocks demo --web``: write the browser demo and serve it on 127.0.0.1 until interrupted."""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path
from typing import IO

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.web.server import serve, url_of
from onnxblocks.web.site import build_site

#: The port ``onnxblocks demo --web`` tries first (another free one when it is taken).
DEFAULT_PORT = 8000


def run_web_demo(
    output_dir: str | os.PathLike,
    epochs: int = 30,
    seed: int = 0,
    port: int = DEFAULT_PORT,
    stream: IO[str] | None = None,
    forever: bool = True,
) -> str:
    """Build the browser demo into ``<output_dir>/web`` and serve it on 127.0.0.1.

    Args:
        output_dir: The demo's output folder (the site goes to its ``web/``).
        epochs: Epochs the page trains.
        seed: Seed of data, weights and batch order.
        port: The port; 0 picks a free one. When :data:`DEFAULT_PORT` is taken, another free one is
        used.
        stream: Where to print (default ``sys.stdout``).
        forever: Serve until interrupted (Ctrl-C); False returns right after printing the URL
            with the server stopped (for tests of the build).

    Returns:
        The page's URL.

    Raises:
        ValueError: for a port outside 0..65535.
        OSError: when the port given is taken.
        onnxblocks.web.npm.NpmError: when the client or onnxruntime-web cannot be had.
    """
    if not 0 <= port <= 65535:
        raise InvalidValueError(f"port must be between 0 and 65535 (0: any free port), got {port}.")
    out = stream if stream is not None else sys.stdout
    started = time.perf_counter()
    site = build_site(Path(os.fspath(output_dir)) / "web", epochs=epochs, seed=seed)
    try:
        server = serve(site, port)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port != DEFAULT_PORT:
            raise
        server = serve(site, 0)
    url = url_of(server)
    out.write(
        "onnxblocks demo --web: the spiral classifier as portable artifacts, trained in the "
        "browser by "
        f"onnxruntime-web (WASM)\n  site written to {site} in "
        f"{time.perf_counter() - started:.1f} s\n"
        f"  open {url}\n  (served on 127.0.0.1 only, no CDN: the page works offline; Ctrl-C "
        "stops the server)\n"
    )
    out.flush()
    try:
        if forever:
            server.serve_forever()
    except KeyboardInterrupt:
        out.write("stopped\n")
    finally:
        server.server_close()
    return url
