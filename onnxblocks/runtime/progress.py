"""A small progress bar for training loops, written to stderr (no tqdm).

On a terminal the bar redraws one line in place, at most ``refresh_hz`` times a
second::

    epoch 3/20 [##########..........]  14/28 loss 0.4312 lr 1.0e-02 5120 samples/s 00:02<00:02

When the stream is not a terminal (a log file, CI), it writes one line per
epoch instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import IO


class ProgressBar:
    """Report epoch, batch, smoothed loss, learning rate and throughput.

    Args:
        stream: Where to write (default ``sys.stderr``).
        width: Characters of the bar itself.
        refresh_hz: Maximum redraws per second on a terminal.
        dynamic: Redraw in place (True) or write a line per epoch (False);
            default: whether ``stream`` is a terminal.

    The ``loss`` shown is the mean over the epoch's batches so far.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        width: int = 20,
        refresh_hz: float = 10.0,
        dynamic: bool | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.interval = 1.0 / refresh_hz if refresh_hz > 0 else 0.0
        isatty = getattr(self.stream, "isatty", None)
        self.dynamic = dynamic if dynamic is not None else bool(isatty and isatty())
        self._epoch = 0
        self._epochs = 0
        self._total: int | None = None
        self._done = 0
        self._samples = 0
        self._loss_sum = 0.0
        self._lr: float | None = None
        self._start = 0.0
        self._last_draw = 0.0
        self._line_len = 0

    def start_epoch(self, epoch: int, epochs: int, total: int | None = None) -> None:
        """Begin epoch ``epoch`` (1-based) of ``epochs`` with ``total`` batches (None: unknown)."""
        self._epoch, self._epochs, self._total = epoch, epochs, total
        self._done = 0
        self._samples = 0
        self._loss_sum = 0.0
        self._start = time.perf_counter()
        self._last_update = self._start
        self._last_draw = 0.0

    def update(self, loss: float, samples: int, lr: float | None = None) -> None:
        """Record one finished batch of ``samples`` rows with its loss."""
        self._done += 1
        self._samples += samples
        self._lr = lr if lr is not None else self._lr
        self._loss_sum += loss
        now = time.perf_counter()
        self._last_update = now
        if self.dynamic and now - self._last_draw >= self.interval:
            self._last_draw = now
            self._draw(self._line())

    def end_epoch(self, summary: str = "") -> None:
        """Finish the epoch line, adding ``summary`` (e.g. eval metrics)."""
        line = self._line(final=True) + (f" | {summary}" if summary else "")
        if self.dynamic:
            self._draw(line)
            self.stream.write("\n")
            self._line_len = 0
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End a line left half-drawn (e.g. when training stopped with an exception)."""
        if self.dynamic and self._line_len:
            self.stream.write("\n")
            self.stream.flush()
            self._line_len = 0

    @property
    def throughput(self) -> float:
        """Samples per second in the current epoch (up to its last batch)."""
        elapsed = self._last_update - self._start
        return self._samples / elapsed if elapsed > 0 else 0.0

    def _line(self, final: bool = False) -> str:
        width = len(str(self._epochs))
        parts = [f"epoch {self._epoch:>{width}}/{self._epochs}"]
        if self._total:
            filled = min(self.width, round(self.width * self._done / self._total))
            count = len(str(self._total))
            parts.append(
                f"[{'#' * filled}{'.' * (self.width - filled)}] {self._done:>{count}}/{self._total}"
            )
        else:
            parts.append(f"{self._done} batches")
        if self._done:
            parts.append(f"loss {self._loss_sum / self._done:.4f}")
        if self._lr is not None:
            parts.append(f"lr {self._lr:.1e}")
        parts.append(f"{self.throughput:,.0f} samples/s")
        elapsed = (self._last_update if final else time.perf_counter()) - self._start
        timing = _clock(elapsed)
        if self._total and self._done and not final:
            timing += "<" + _clock(elapsed / self._done * (self._total - self._done))
        parts.append(timing)
        return " ".join(parts)

    def _draw(self, line: str) -> None:
        pad = max(0, self._line_len - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._line_len = len(line)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
