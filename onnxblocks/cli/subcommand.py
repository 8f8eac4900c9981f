"""How every ``onnxblocks`` subcommand registers its parser: one shape for the command list."""

from __future__ import annotations

import argparse
from typing import Any


def subcommand(
    commands: Any,
    parents: list[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str,
    examples: str | None = None,
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, with the options of ``parents``.

    ``help`` is its line in ``onnxblocks --help``, ``description`` opens its own help, and
    ``examples`` (printed as written, line breaks kept) closes it.
    """
    formatter = argparse.RawDescriptionHelpFormatter if examples else argparse.HelpFormatter
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        parents=parents,
        help=help,
        description=description,
        epilog=examples,
        formatter_class=formatter,
    )
    return parser
