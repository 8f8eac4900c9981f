"""``onnxblocks clean``: remove what killed ``generate_artifacts`` runs left in and beside an
artifact directory.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from onnxblocks.cli.errors import EXIT_INPUT, EXIT_OK, CliError
from onnxblocks.cli.subcommand import subcommand
from onnxblocks.cli.tables import format_bytes

EXAMPLES = """\
examples:
  onnxblocks clean artifacts

A staging folder (.onnxblocks-artifacts-<pid>-<token>@<host> inside DIR, or
.<DIR name>.onnxblocks-artifacts-... beside it) whose process is no longer running on this host is
removed; a commit it cut short is rolled back to the previous complete set first. Folders of running
processes and of other hosts are kept. Every onnxblocks call that opens DIR does the same; this
command does it on demand."""


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``clean`` subcommand."""
    parser = subcommand(
        commands,
        parents,
        "clean",
        help="remove the staging folders killed runs left in or beside an artifact directory",
        description="Remove the staging folders that killed generate_artifacts runs left in or "
        "beside DIR "
        "(rolling back a replacement they cut short), and list those kept.",
        examples=EXAMPLES,
    )
    parser.add_argument("directory", metavar="DIR", help="artifact directory")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Clean and report."""
    from onnxblocks._core.leftovers import HOST_TAG, clean, leftovers

    directory = Path(args.directory)
    if directory.exists() and not directory.is_dir():
        raise CliError(f"'{directory}' is a file; pass an artifact directory.", EXIT_INPUT)
    found = leftovers(directory)
    if not directory.exists() and not found:
        raise CliError(f"'{directory}' does not exist, and nothing was left beside it.", EXIT_INPUT)
    removed = {os.fspath(p) for p in clean(directory)}
    out = sys.stdout
    for stage in found:
        if os.fspath(stage.path) in removed:
            state = "removed"
        elif stage.stale:
            state = "kept (it could not be removed)"
        else:
            state = (
                "kept: its run is in progress"
                if stage.host == HOST_TAG
                else "kept: another host's run"
            )
        out.write(f"{stage.path} (pid {stage.pid}, {format_bytes(stage.nbytes)}): {state}\n")
    staged = {os.fspath(s.path) for s in found}
    for path in sorted(removed - staged):
        out.write(f"{path}: removed (a temporary file of a killed run)\n")
    freed = sum(s.nbytes for s in found if os.fspath(s.path) in removed)
    out.write(
        f"removed {len(removed)} leftover(s) of killed runs ({format_bytes(freed)} of staging "
        "folders)\n"
    )
    return EXIT_OK
