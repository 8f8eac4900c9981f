"""Stop signals are never lost: ``onnxblocks._core.interrupts`` and the waits of ``federated.processes``.

The family: SIGINT inherited ignored (a non-interactive shell's background job), a ``KeyboardInterrupt``
swallowed in a finalizer, a second signal while children are stopped, and a child command being waited
for when the signal comes. The end-to-end check (``onnxblocks federate`` under load) is
``tests/federated/test_cli_federate.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from onnxblocks._core.interrupts import raise_if_stopping, shielded, stop_on_signals, stopping


class _SignalsInFinalizer:
    """Raises ``signum`` from ``__del__``, where Python swallows the handler's exception."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        signal.raise_signal(self.signum)


@pytest.fixture
def sigint_ignored():
    """SIGINT ignored, as a command started in the background by a non-interactive shell inherits it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_raises_keyboard_interrupt_even_when_sigint_was_inherited_ignored(
    sigint_ignored, signum
):
    with pytest.raises(KeyboardInterrupt):
        with stop_on_signals():
            signal.raise_signal(signum)
            raise AssertionError(f"{signal.Signals(signum).name} did not interrupt")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # what was there before is back
    assert not stopping()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_swallowed_in_a_finalizer_is_raised_again_at_the_next_check():
    with stop_on_signals():
        _SignalsInFinalizer(signal.SIGINT)  # collected at once: its KeyboardInterrupt is "ignored"
        assert stopping()
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopping()
    raise_if_stopping()  # outside, nothing is pending


def test_while_shielded_both_signals_are_ignored_and_the_handlers_come_back():
    with stop_on_signals():
        with shielded():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
        assert not stopping()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)


def _running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _sleeper(marker: str) -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(600)", marker]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_waited_command_stops_on_a_signal_whose_exception_was_swallowed():
    """The command is waited for in short turns, so a pending stop ends the wait and kills it (not 600 s later)."""
    from onnxblocks.federated.processes import run_captured

    marker = f"onnxblocks-test-{uuid.uuid4().hex}"
    with stop_on_signals():
        _SignalsInFinalizer(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            run_captured(_sleeper(marker), os.environ, timeout=600)
    assert _running(marker) == []


def test_a_waited_command_is_killed_when_the_signal_comes_during_the_wait():
    from onnxblocks.federated.processes import run_captured

    marker = f"onnxblocks-test-{uuid.uuid4().hex}"
    started = threading.Event()

    def signal_once_started() -> None:
        while not _running(marker):
            if started.wait(0.05):  # set by the test when it is over
                return
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=signal_once_started, daemon=True)
    with stop_on_signals():
        sender.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                run_captured(_sleeper(marker), os.environ, timeout=600)
        finally:
            started.set()
            sender.join()
    assert _running(marker) == []


def test_a_command_past_its_timeout_is_killed():
    from onnxblocks.federated.processes import run_captured

    marker = f"onnxblocks-test-{uuid.uuid4().hex}"
    with pytest.raises(subprocess.TimeoutExpired):
        run_captured(_sleeper(marker), os.environ, timeout=0.5)
    assert _running(marker) == []


def test_python_m_exits_with_the_commands_code_after_an_interrupt_caught_inside_exec(tmp_path):
    """A stop signal that lands while a string is exec'd (a dataclass or namedtuple being made) and is
    caught by the command still ends ``python -m onnxblocks`` with the command's 130, not by SIGINT
    (CPython's record of that interrupt outlives the ``except``; ``onnxblocks federate`` under load hit it).
    """
    (tmp_path / "sitecustomize.py").write_text(
        "import onnxblocks.cli.app as app\n"
        "def main():\n"
        "    try:\n"
        "        exec('raise KeyboardInterrupt')\n"
        "    except KeyboardInterrupt:\n"
        "        return 130\n"
        "app.main = main\n",
        encoding="utf-8",
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    done = subprocess.run(
        [sys.executable, "-m", "onnxblocks"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130, done.stderr
