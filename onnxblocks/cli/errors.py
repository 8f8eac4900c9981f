"""Exit codes of the ``onnxblocks`` command, and the error every subcommand reports with."""

from __future__ import annotations

from onnxblocks._core.errors import OnnxBlocksError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_INTERRUPTED = 130


class CliError(OnnxBlocksError):
    """An error to report as one line, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_INPUT) -> None:
        super().__init__(message)
        self.code = code
