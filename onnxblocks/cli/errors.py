"""Exit codes of the ``onnxblocks`` command, and the error every subcommand reports with."""

from __future__ import annotations

from onnxblocks._core.errors import CliError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_INTERRUPTED = 130

__all__ = ["EXIT_FAILURE", "EXIT_INPUT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "CliError"]
