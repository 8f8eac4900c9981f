"""Stopping on SIGINT and SIGTERM without losing the signal, and stops that a second signal cannot
cut short.

Python turns SIGINT into ``KeyboardInterrupt`` only when SIGINT was not ignored as the interpreter
started
(a command a non-interactive shell starts in the background inherits it ignored, and then sleeps
through
every Ctrl-C and ``kill -INT``), and an exception raised from a signal handler is swallowed when it
lands in
a finalizer (``__del__``). A command that must stop its child processes on a signal therefore runs
inside
:func:`stop_on_signals`: SIGINT and SIGTERM raise ``KeyboardInterrupt`` there, whatever was
inherited, and
are remembered, so that its waiting loops, which call :func:`raise_if_stopping`, raise a swallowed
one
again within one turn. While the children are being stopped, :func:`shielded` ignores both signals,
so that
an impatient second Ctrl-C cannot leave some of them running.

Signals are process-wide; so is this state. Handlers can only be set in the main thread: elsewhere
both
context managers do nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: The signals that stop a command.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# the stop signals received inside stop_on_signals, in order (process-wide, as signals are)
_received: list[int] = []


def _stop(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _handlers(handler: signal.Handlers | object) -> Iterator[None]:
    if not _main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)  # type: ignore[arg-type]
    try:
        yield
    finally:
        for (
            sig,
            old,
        ) in previous.items():  # None: a handler set outside Python, which cannot be put back
            signal.signal(sig, signal.SIG_DFL if old is None else old)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` inside, even where they were inherited
    ignored.
    """
    _received.clear()
    try:
        with _handlers(_stop):
            yield
    finally:
        _received.clear()


def stopping() -> bool:
    """Whether a stop signal arrived inside :func:`stop_on_signals`."""
    return bool(_received)


def raise_if_stopping() -> None:
    """Raise ``KeyboardInterrupt`` when a stop signal arrived (its own exception may have been
    swallowed).

    Raises:
        KeyboardInterrupt: when :func:`stopping`.
    """
    if _received:
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """Stop signals wait until the block ends, then reach the handler they would have reached.

    For starting a child process: a ``KeyboardInterrupt`` between its fork and the moment the
    caller holds its handle would leave it running with nobody to stop it.
    """
    if not _main_thread():
        yield
        return
    pending: list[int] = []
    with _handlers(lambda signum, frame: pending.append(signum)):
        yield
    if pending:
        signal.raise_signal(pending[0])


@contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM are ignored inside: for stopping child processes, which must run to its
    end.
    """
    with _handlers(signal.SIG_IGN):
        yield
