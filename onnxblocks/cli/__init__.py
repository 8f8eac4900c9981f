"""The ``onnxblocks`` command line: artifacts, inspect, train, demo, doctor.

Run ``onnxblocks --help`` (or ``python -m onnxblocks.cli --help``). Exit codes
are documented in :mod:`onnxblocks.cli.app`.
"""

from onnxblocks.cli.app import main
from onnxblocks.cli.errors import (
    EXIT_FAILURE,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
)

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "main",
]
