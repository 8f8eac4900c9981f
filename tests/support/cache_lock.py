"""One builder at a time for each shared test cache, across processes (pytest-xdist workers, parallel sessions).

The caches the tests build on first use (the Python 3.13 venvs, the client's npm packages, Debian
packages installed with apt-get) are shared by every process that runs tests. Each builder holds
:func:`cache_lock` while it looks for the finished cache and builds it, so a second process waits for
the first one's result instead of building the same thing beside it (or, for apt-get, failing on
dpkg's lock). The lock is an ``flock`` on ``<cache>/locks/<name>.lock``: the operating system releases
it when its holder exits, even when killed, so nothing is ever left locked.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: one process's threads are still serialised
    fcntl = None  # type: ignore[assignment]

#: Threads of one process share a descriptor table, where flock does not exclude them.
_THREAD_LOCKS: dict[str, threading.Lock] = {}
_GUARD = threading.Lock()


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/onnxblocks-test`` (``~/.cache/onnxblocks-test`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onnxblocks-test"


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the exclusive lock ``name`` (one per cache entry) until the block ends, waiting for it."""
    with _GUARD:
        local = _THREAD_LOCKS.setdefault(name, threading.Lock())
    with local:
        if fcntl is None:  # pragma: no cover - Windows
            yield
            return
        directory = cache_dir() / "locks"
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock
