"""The gradient-builder worker process: requests and answers over its stdin and stdout.

:func:`exchange_once` runs :mod:`onnxblocks.gradient.worker_main` for one request
(probing an interpreter); a :class:`Channel` keeps one worker process running for
the calls of this process. The protocol is described in ``worker_main``: a JSON
header line, then the bytes it announces, each way.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from onnxblocks._core.errors import GradientError

#: The script the worker Python runs.
WORKER_SCRIPT = Path(__file__).with_name("worker_main.py")


def exchange_once(
    python: Path, header: dict[str, Any], blobs: Sequence[bytes], timeout: float
) -> tuple[dict[str, Any], list[bytes]]:
    """Start the worker script with ``python``, send one request, return its answer header and
    bytes.

    Raises:
        GradientError: when the worker does not start, crashes or does not answer in ``timeout``
        seconds.
    """
    request = (
        json.dumps({**header, "sizes": [len(b) for b in blobs]}).encode() + b"\n" + b"".join(blobs)
    )
    try:
        done = subprocess.run(
            [os.fspath(python), "-I", os.fspath(WORKER_SCRIPT)],
            input=request,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise GradientError(
            f"The gradient-builder worker ({python}) did not answer in {timeout:.0f} s."
        ) from None
    except OSError as exc:
        raise GradientError(
            f"The gradient-builder worker ({python}) could not start: {exc}."
        ) from None
    line, _, rest = done.stdout.partition(b"\n")
    try:
        answer = json.loads(line)
        sizes = [int(s) for s in answer.pop("sizes")]
    except (ValueError, KeyError, TypeError):
        stderr = done.stderr.decode(errors="replace")[-3000:]
        raise GradientError(
            f"The gradient-builder worker ({python}) failed (exit {done.returncode}) without an "
            f"answer:\n{stderr}"
        ) from None
    out: list[bytes] = []
    for size in sizes:
        out.append(rest[:size])
        rest = rest[size:]
    if sum(sizes) != sum(len(b) for b in out):
        raise GradientError(f"The gradient-builder worker ({python}) sent a truncated answer.")
    return answer, out


class Channel:
    """One worker process kept running for this process's calls (its start, ~0.3 s, is paid once).

    Calls are serialised by a lock; a call that runs past its timeout kills the worker
    (a watchdog timer), and a worker that died is started again on the next call.
    Its stderr goes to a temporary file, read back when it fails.
    """

    def __init__(self, python: Path, remedy: str = "") -> None:
        self.python = python
        self.remedy = remedy
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr: IO[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        self.close()
        self.stderr = tempfile.TemporaryFile()
        try:
            self.process = subprocess.Popen(
                [os.fspath(self.python), "-I", os.fspath(WORKER_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
            )
        except OSError as exc:
            raise GradientError(
                f"The gradient-builder worker ({self.python}) could not start: {exc}."
            ) from None
        return self.process

    def _stderr_tail(self) -> str:
        if self.stderr is None:
            return ""
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-3000:]

    def exchange(
        self, header: dict[str, Any], blobs: Sequence[bytes], timeout: float
    ) -> tuple[dict[str, Any], list[bytes]]:
        with self.lock:
            process = (
                self.process
                if self.process is not None and self.process.poll() is None
                else self._start()
            )
            assert process.stdin is not None and process.stdout is not None
            fired = threading.Event()

            def expire() -> None:
                fired.set()
                process.kill()

            watchdog = threading.Timer(timeout, expire)
            watchdog.start()
            try:
                process.stdin.write(
                    json.dumps({**header, "sizes": [len(b) for b in blobs]}).encode() + b"\n"
                )
                for blob in blobs:
                    process.stdin.write(blob)
                process.stdin.flush()
                answer = json.loads(process.stdout.readline())
                sizes = [int(s) for s in answer.pop("sizes")]
                out = [process.stdout.read(size) for size in sizes]
                if [len(b) for b in out] == sizes:
                    return answer, out
            except (OSError, ValueError, KeyError, TypeError):
                pass
            finally:
                watchdog.cancel()
            # no complete answer: the worker crashed, or the watchdog killed it
            timed_out = fired.is_set()
            process.kill()
            process.wait()
            tail = self._stderr_tail()
            self.close()
            if timed_out:
                raise GradientError(
                    f"The gradient-builder worker ({self.python}) did not answer in "
                    f"{timeout:.0f} s."
                ) from None
            raise GradientError(
                f"The gradient-builder worker ({self.python}) failed (exit {process.returncode}) "
                "without an "
                f"answer:\n{tail}\n{self.remedy}"
            )

    def close(self) -> None:
        """End the worker (it exits when its stdin closes)."""
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            with contextlib.suppress(OSError):
                if process.stdout is not None:
                    process.stdout.close()
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None
