"""``onnxblocks doctor``: which backend and gradient builder each Python on this machine would use.

For this Python and every CPython 3.10-3.14 found through pyenv, uv or the PATH,
it reports the onnxruntime installed there (the training build, the stock build,
or none) and so:

* the **backend** that trains artifacts: ONNX Runtime's training API (training
  build) and the portable backend, or the portable backend only (stock build);
* the **gradient builder** ``generate_artifacts`` uses: ``in-process`` with the
  training build, else ``worker``: ONNX Runtime's gradient builder in a Python
  3.10-3.12 with onnxruntime-training (docs/artifacts.md, "Generating on any Python").

Nothing is installed or created; ``--json`` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from onnxblocks.cli.errors import EXIT_OK
from onnxblocks.cli.subcommand import subcommand

#: The Python versions looked for besides the running one.
VERSIONS = ((3, 14), (3, 13), (3, 12), (3, 11), (3, 10))


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``doctor`` subcommand."""
    parser = subcommand(
        commands,
        parents,
        "doctor",
        help="report which backend and gradient builder each Python on this machine would use",
        description="For this Python and each Python 3.10-3.14 found (pyenv, uv, PATH): the "
        "onnxruntime build "
        "installed there, the backend that trains artifacts, and where generate_artifacts runs "
        "ONNX Runtime's "
        "gradient builder (in-process with onnxruntime-training, else a worker Python 3.10-3.12).",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(handler=run)


def _worker_plan() -> dict[str, Any]:
    """Where a Python without the training build sends the gradient builder (nothing is created)."""
    from onnxblocks._core.errors import TrainingBuildRequiredError
    from onnxblocks.gradient import worker

    try:
        base, version, where = worker.find_base_python()
    except TrainingBuildRequiredError as exc:
        return {"python": None, "error": str(exc)}
    target = worker.environment_dir(base, version)
    return {
        "python": os.fspath(base),
        "version": f"{version[0]}.{version[1]}",
        "found_by": where,
        "environment": os.fspath(target),
        "ready": worker.environment_ready(target),
    }


def _entry(python: Path, found_by: str, plan: dict[str, Any]) -> dict[str, Any]:
    from onnxblocks.gradient import worker

    version = worker.python_version(python)
    info = worker.probe(python) if version is not None else None
    entry: dict[str, Any] = {
        "python": os.fspath(python),
        "version": f"{version[0]}.{version[1]}" if version else None,
        "found_by": found_by,
        "onnxruntime": info.get("onnxruntime") if info else None,
        "training_build": bool(info and info.get("training_build")),
    }
    if version is None:
        entry.update(backend="none", gradient_builder="none", note="does not run")
        return entry
    if info is None:  # no onnxruntime there: what `pip install onnxblocks` would bring
        training = version in worker.TRAINING_PYTHONS
        entry["note"] = "onnxblocks not installed: " + (
            "pip install onnxblocks brings onnxruntime-training-cpu 1.19.2"
            if training
            else "pip install onnxblocks brings stock onnxruntime"
        )
    else:
        training = entry["training_build"]
    entry["backend"] = "training API + portable" if training else "portable (stock onnxruntime)"
    if training:
        entry["gradient_builder"] = "in-process (onnxruntime-training)"
    elif plan.get("python"):
        entry["gradient_builder"] = f"worker (Python {plan['version']}: {plan['python']})"
    else:
        entry["gradient_builder"] = "none (no Python 3.10-3.12 found)"
    return entry


def report() -> dict[str, Any]:
    """The report: this Python first, then the others found."""
    from onnxblocks.gradient import worker

    plan = _worker_plan()
    current = Path(sys.executable)
    entries = [_entry(current, "this Python", plan)]
    entries[0]["gradient_builder"] = (
        f"worker (Python {plan['version']}: {plan['python']})"
        if worker.uses_worker() and plan.get("python")
        else entries[0]["gradient_builder"]
    )
    seen = {os.path.realpath(current)}
    for path, where in worker.candidate_pythons(VERSIONS):
        if os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        entries.append(_entry(path, where, plan))
    return {"pythons": entries, "worker": plan}


def run(args: argparse.Namespace) -> int:
    """Print the report."""
    found = report()
    if args.json:
        print(json.dumps(found, indent=2))
        return EXIT_OK
    for entry in found["pythons"]:
        ort = entry["onnxruntime"] or "none"
        build = (
            "training build"
            if entry["training_build"]
            else ("stock" if entry["onnxruntime"] else "")
        )
        print(f"Python {entry['version']}  {entry['python']}  ({entry['found_by']})")
        print(f"  onnxruntime:      {ort} {build}".rstrip())
        print(f"  backend:          {entry['backend']}")
        print(f"  gradient builder: {entry['gradient_builder']}")
        if entry.get("note"):
            print(f"  note:             {entry['note']}")
    plan = found["worker"]
    if plan.get("python"):
        state = "ready" if plan["ready"] else "created on first use"
        print(
            f"worker environment: {plan['environment']} ({state}; from {plan['python']}, "
            f"{plan['found_by']})"
        )
    else:
        print(f"worker: {plan['error']}")
    return EXIT_OK
