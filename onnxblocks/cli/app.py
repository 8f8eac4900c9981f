"""The ``onnxblocks`` command: argument parsing, error reporting and exit codes.

Exit codes (scripts can rely on them):

====  ====================================================================
0     success
1     runtime failure (training failed, ONNX Runtime error, demo missed its target)
2     usage error (unknown option, missing argument, conflicting options)
3     input error (missing or unreadable file, invalid model, data that does not
      fit the model, unknown parameter name or pattern)
130   interrupted (Ctrl-C)
====  ====================================================================

Errors are printed to stderr as one line, ``onnxblocks: error: <what> <remedy>``,
with no traceback unless ``--verbose`` is given.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from onnxblocks.cli.errors import (
    EXIT_FAILURE,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
)

PROG = "onnxblocks"

EPILOG = """\
examples:
  onnxblocks demo --output-dir demo
  onnxblocks artifacts model.onnx --loss crossentropy --all-params -o artifacts
  onnxblocks inspect artifacts
  onnxblocks train artifacts --data train.npz --epochs 10 --batch-size 32 --lr 1e-3 --save ckpt
  onnxblocks clean artifacts
  onnxblocks federate artifacts --client-data a.npz --client-data b.npz --rounds 5 --save ckpt

exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 input error (file, model or data),
130 interrupted.
Run 'onnxblocks COMMAND --help' for the options of a command."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')", EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The full ``onnxblocks`` parser with its subcommands."""
    from onnxblocks._core.version import __version__
    from onnxblocks.cli import (
        artifacts,
        clean,
        demo,
        doctor,
        export_hub,
        federate,
        inspection,
        train,
    )

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the traceback of errors, and ONNX Runtime's warnings",
    )
    parser = _Parser(
        prog=PROG,
        description="Compose ONNX training graphs, generate ONNX Runtime training artifacts, and "
        "train "
        "them without torch.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (artifacts, inspection, train, clean, demo, doctor, federate, export_hub):
        module.add_parser(commands, [common])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args_list or "--verbose" in args_list
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help and --version
            return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_OK
        verbose = bool(getattr(args, "verbose", False))
        if (
            verbose
        ):  # ONNX Runtime's warnings too (by default the sessions onnxblocks opens log errors only)
            from onnxblocks._core.ort import set_log_level

            set_log_level(2)
            try:
                return _run(parser, args)
            finally:
                set_log_level(None)
        return _run(parser, args)
    except KeyboardInterrupt:
        _report("interrupted", verbose)
        return EXIT_INTERRUPTED
    except CliError as exc:
        _report(str(exc), verbose and exc.code != EXIT_USAGE)
        return exc.code
    except Exception as exc:
        _report(describe(exc), verbose)
        return exit_code_for(exc)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return handler(args)


def exit_code_for(exc: BaseException) -> int:
    """The exit code for an exception: 3 for bad input (files, models, data, names), else 1."""
    from onnxblocks._core.errors import GradientError, OrtRunError
    from onnxblocks.runtime import _ort

    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, OrtRunError):
        return EXIT_INPUT if exc.input_error else EXIT_FAILURE
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return EXIT_INPUT
    if _ort.is_ort_error(exc):
        return EXIT_INPUT if _ort.is_input_error(exc) else EXIT_FAILURE
    if isinstance(exc, (ValueError, TypeError, LookupError, GradientError)):
        return EXIT_INPUT
    if type(exc).__name__ in (
        "ValidationError",
        "DecodeError",
        "InferenceError",
    ):  # onnx / protobuf
        return EXIT_INPUT
    return EXIT_FAILURE


def describe(exc: BaseException) -> str:
    """One line describing ``exc`` (its message; its type when the message is empty)."""
    from onnxblocks.runtime import _ort

    message = _ort.clean_message(exc) if _ort.is_ort_error(exc) else " ".join(str(exc).split())
    if type(exc).__name__ == "DecodeError":
        message = f"cannot parse the file as an ONNX model ({message or 'protobuf decode error'})"
    if not message:
        message = type(exc).__name__
    elif isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError) and exc.filename:
        message = f"{exc.strerror or message}: '{exc.filename}'"
    return message


def _report(message: str, verbose: bool) -> None:
    if verbose:
        traceback.print_exc(file=sys.stderr)
    line = " ".join(message.split())
    sys.stderr.write(f"{PROG}: error: {line}\n")
    sys.stderr.flush()
