"""A TensorSource that records how a writer reads it: the streaming tests of the checkpoint and
model writers.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxblocks._core.weights import TensorSource


@dataclass(frozen=True)
class RecordingSource(TensorSource):
    """Appends the length of each chunk read to ``log``; ``read()`` (the whole tensor) fails."""

    log: list | None = None

    def chunks(self, chunk_bytes=16 * 1024 * 1024):
        for piece in super().chunks(chunk_bytes):
            assert self.log is not None
            self.log.append(len(piece))
            yield piece

    def read(self):
        raise AssertionError("the writer must stream, not read() whole tensors")
