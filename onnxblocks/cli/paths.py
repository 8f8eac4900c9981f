"""Output paths and numeric options of the commands, checked before any work starts.

A training run that fails at its end because ``--export`` names a directory, or
``--save`` lies below a file, loses the run. Each command checks its outputs
first (:func:`output_file`, :func:`output_dir`: exit 3, input error) and its
numeric options (:func:`require`: exit 2, usage error).
"""

from __future__ import annotations

import math

from onnxblocks._core.paths import check_output_dir, check_output_file
from onnxblocks.cli.errors import EXIT_INPUT, EXIT_USAGE, CliError


def output_file(value: str | None, option: str, *, create_parents: bool = False) -> None:
    """Check that ``option``'s file can be written (nothing to do for None).

    Raises:
        CliError: (exit 3) naming the option, the path and the problem.
    """
    if value is None:
        return
    try:
        check_output_file(value, option, create_parents=create_parents)
    except (OSError, ValueError, TypeError) as exc:
        raise CliError(str(exc), EXIT_INPUT) from None


def output_dir(value: str | None, option: str) -> None:
    """Check that ``option``'s directory can be created or written (nothing to do for None).

    Raises:
        CliError: (exit 3) naming the option, the path and the problem.
    """
    if value is None:
        return
    try:
        check_output_dir(value, option)
    except (OSError, ValueError, TypeError) as exc:
        raise CliError(str(exc), EXIT_INPUT) from None


def require(
    value: float | int | None,
    option: str,
    *,
    minimum: float | None = None,
    above: float | None = None,
) -> None:
    """Check a numeric option: finite, and ``>= minimum`` / ``> above`` (nothing to do for None).

    Raises:
        CliError: (exit 2) naming the option, the value and the valid range.
    """
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise CliError(f"{option} must be a finite number, got {value}.", EXIT_USAGE)
    if minimum is not None and value < minimum:
        raise CliError(f"{option} must be >= {minimum}, got {value}.", EXIT_USAGE)
    if above is not None and value <= above:
        raise CliError(f"{option} must be > {above}, got {value}.", EXIT_USAGE)
