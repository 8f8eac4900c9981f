"""``onnxblocks inspect``: inputs, outputs and parameters of a model file or an artifact directory.

Nothing here imports onnxruntime: models are read with onnx (without their
external data) and checkpoints with :mod:`onnxblocks.checkpoint`, so sizes come
from shapes and dtypes, not from reading weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import astuple
from pathlib import Path
from typing import Any

from onnxblocks._core.contracts import ArtifactNames, is_accumulation_value
from onnxblocks.cli.errors import EXIT_INPUT, EXIT_OK, CliError
from onnxblocks.cli.subcommand import subcommand
from onnxblocks.cli.tables import format_bytes, format_table

EXAMPLES = """\
examples:
  onnxblocks inspect model.onnx             # a forward model: inputs, outputs, initializers
  onnxblocks inspect artifacts              # training artifacts: inputs, outputs, trainable/frozen
  onnxblocks inspect artifacts --json       # the same, machine-readable
  onnxblocks inspect ckpt                   # a checkpoint: parameters, step, properties"""


def add_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``inspect`` subcommand."""
    parser = subcommand(
        commands,
        parents,
        "inspect",
        help="show inputs, outputs and parameters of a model or artifact directory",
        description="Print a table of the inputs, outputs and parameters (shape, dtype, "
        "trainable/frozen, "
        "bytes, totals) of an ONNX model file or of a training artifact directory.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "path",
        metavar="MODEL.onnx|DIR|CHECKPOINT",
        help="an .onnx file, an artifact directory or a checkpoint file",
    )
    parser.add_argument(
        "--prefix", default="", help="file-name prefix of the artifacts (for a directory)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Inspect and print."""
    from onnxblocks.checkpoint import is_checkpoint

    path = Path(args.path)
    if path.is_dir():
        report = inspect_artifacts(path, args.prefix)
    elif path.is_file():
        report = inspect_checkpoint(path) if is_checkpoint(path) else inspect_model(path)
    elif path.exists():
        raise CliError(
            f"'{path}' is not a regular file (a pipe or device?); pass an .onnx file, an artifact "
            "directory or a checkpoint.",
            EXIT_INPUT,
        )
    else:
        raise CliError(
            f"'{path}' does not exist; pass an .onnx file, an artifact directory or a checkpoint.",
            EXIT_INPUT,
        )
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else render(report))
    return EXIT_OK


# ------------------------------------------------------------------ reading
def _load(path: Path) -> Any:
    import onnx

    try:
        return onnx.load(os.fspath(path), load_external_data=False)
    except Exception as exc:
        raise CliError(
            f"cannot read '{path}' as an ONNX model: "
            f"{' '.join(str(exc).split()) or type(exc).__name__}."
            " Pass an .onnx file.",
            EXIT_INPUT,
        ) from None


def _dtype(elem_type: int) -> str:
    import onnx

    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _value_info(vi: Any) -> dict[str, Any]:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        return {"name": vi.name, "dtype": t.WhichOneof("value") or "unknown", "shape": None}
    shape = None
    if t.tensor_type.HasField("shape"):
        shape = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in t.tensor_type.shape.dim
        ]
    return {"name": vi.name, "dtype": _dtype(t.tensor_type.elem_type), "shape": shape}


def _tensor(name: str, dtype: str, dims: list[int], status: str, nbytes: int) -> dict[str, Any]:
    elements = 1
    for d in dims:
        elements *= d
    return {
        "name": name,
        "dtype": dtype,
        "shape": dims,
        "status": status,
        "elements": elements,
        "bytes": nbytes,
    }


def inspect_model(path: Path) -> dict[str, Any]:
    """Describe an ONNX model file: inputs, outputs, initializers and totals."""
    from onnxblocks._core.weights import tensor_nbytes

    model = _load(path)
    g = model.graph
    init_names = {i.name for i in g.initializer}
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    params = [
        _tensor(i.name, _dtype(i.data_type), list(i.dims), "initializer", tensor_nbytes(i))
        for i in g.initializer
    ]
    return {
        "kind": "model",
        "path": os.fspath(path),
        "ir_version": model.ir_version,
        "opsets": opsets,
        "nodes": len(g.node),
        "inputs": [_value_info(i) for i in g.input if i.name not in init_names],
        "outputs": [_value_info(o) for o in g.output],
        "parameters": params,
        "totals": _totals(params),
        "ties": _ties(model),
    }


def _ties(model: Any) -> list[dict[str, Any]]:
    """The initializers several modules read (docs/training.md, "Weights the exporter tied"); no
    bytes read.
    """
    from onnxblocks.artifacts.ties import find_ties

    found = find_ties(model)
    keys = ("initializer", "modules", "copies", "by_model")
    return [
        {k: list(v) if isinstance(v, tuple) else v for k, v in zip(keys, astuple(t), strict=True)}
        for t in found
    ]


def inspect_checkpoint(path: Path) -> dict[str, Any]:
    """Describe a checkpoint file: parameters, optimizer state, properties."""
    from onnxblocks.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(path)
    params = [_param(name, array, "trainable") for name, array in checkpoint.trainable.items()]
    params += [_param(name, array, "frozen") for name, array in checkpoint.frozen.items()]
    return {
        "kind": "checkpoint",
        "path": os.fspath(path),
        "parameters": params,
        "totals": _totals(params),
        **_checkpoint_state(checkpoint),
    }


def _checkpoint_state(checkpoint: Any) -> dict[str, Any]:
    from onnxblocks.runtime import properties as _props

    state = checkpoint.optimizer_state
    return {
        "optimizer_state": {"saved": bool(state), "step": state.step if state else None},
        "properties": {k: _props.decode(v) for k, v in checkpoint.properties.items()},
    }


def inspect_artifacts(directory: Path, prefix: str = "") -> dict[str, Any]:
    """Describe an artifact directory: user inputs/outputs, checkpoint parameters, optimizer
    state.
    """
    from onnxblocks._core.leftovers import HOST_TAG, leftovers
    from onnxblocks.checkpoint import load_checkpoint
    from onnxblocks.runtime.layout import ArtifactFiles

    staged = [
        {
            "path": os.fspath(found.path),
            "pid": found.pid,
            "bytes": found.nbytes,
            "state": "removed (its run was killed)"
            if found.stale
            else ("in progress" if found.host == HOST_TAG else "another host's (kept)"),
        }
        for found in leftovers(directory)
    ]
    files = ArtifactFiles.find(directory, prefix)  # removes the leftovers of killed runs
    checkpoint = load_checkpoint(files.checkpoint)
    params = [_param(name, array, "trainable") for name, array in checkpoint.trainable.items()]
    params += [_param(name, array, "frozen") for name, array in checkpoint.frozen.items()]
    names = {p["name"] for p in params}
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    if files.training_model.suffix == ".onnx":
        training = _load(files.training_model)
        inputs = [
            _value_info(i)
            for i in training.graph.input
            if i.name not in names and not is_accumulation_value(i.name)
        ]
        source = (
            _load(files.eval_model)
            if files.eval_model and files.eval_model.suffix == ".onnx"
            else training
        )
        outputs = [_value_info(o) for o in source.graph.output if not is_accumulation_value(o.name)]
    return {
        "kind": "artifacts",
        "path": os.fspath(directory),
        "files": {
            "training_model": files.training_model.name,
            "eval_model": files.eval_model.name if files.eval_model else None,
            "optimizer_model": files.optimizer_model.name if files.optimizer_model else None,
            "checkpoint": files.checkpoint.name,
        },
        "inputs": inputs,
        "outputs": outputs,
        "parameters": params,
        "totals": _totals(params),
        **_checkpoint_state(checkpoint),
        "staging": staged,
        "base": _base(directory / ArtifactNames(prefix).base_weights, files),
    }


def _base(path: Path, files: Any) -> dict[str, Any] | None:
    """The frozen base the models share (docs/lora.md): its file, size and element type; None
    without one.
    """
    if not path.is_file():
        return None
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "dtype": files.base_dtype or "as exported",
    }


def _param(name: str, array: Any, status: str) -> dict[str, Any]:
    return _tensor(name, str(array.dtype), list(array.shape), status, int(array.nbytes))


def _totals(params: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {
        "count": len(params),
        "elements": sum(p["elements"] for p in params),
        "bytes": sum(p["bytes"] for p in params),
    }
    for status in ("trainable", "frozen"):
        chosen = [p for p in params if p["status"] == status]
        if chosen:
            totals[status] = {
                "count": len(chosen),
                "elements": sum(p["elements"] for p in chosen),
                "bytes": sum(p["bytes"] for p in chosen),
            }
    return totals


# ---------------------------------------------------------------- rendering
def _shape(shape: list[Any] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def render(report: dict[str, Any]) -> str:
    """The report as text tables."""
    lines = []
    if report["kind"] == "model":
        opsets = ", ".join(f"{d} {v}" for d, v in report["opsets"].items())
        lines.append(
            f"model {report['path']}: IR {report['ir_version']}, opsets {opsets}, "
            f"{report['nodes']} nodes"
        )
    elif report["kind"] == "artifacts":
        present = [f for f in report["files"].values() if f]
        lines.append(f"artifacts {report['path']}: {', '.join(present)}")
    else:
        lines.append(f"checkpoint {report['path']}")
    if report["kind"] != "checkpoint":
        rows = [(v["name"], v["dtype"], _shape(v["shape"])) for v in report["inputs"]]
        title = "inputs (train_step/eval_step order)" if report["kind"] == "artifacts" else "inputs"
        lines += ["", title, format_table(("name", "dtype", "shape"), rows) if rows else "  (none)"]
        rows = [(v["name"], v["dtype"], _shape(v["shape"])) for v in report["outputs"]]
        title = "outputs (loss first)" if report["kind"] == "artifacts" else "outputs"
        lines += ["", title, format_table(("name", "dtype", "shape"), rows) if rows else "  (none)"]
    params = report["parameters"]
    param_rows = [
        (
            p["name"],
            p["dtype"],
            _shape(p["shape"]),
            p["status"],
            f"{p['elements']:,}",
            format_bytes(p["bytes"]),
        )
        for p in params
    ]
    title = "parameters (initializers)" if report["kind"] == "model" else "parameters (checkpoint)"
    lines += [
        "",
        title,
        format_table(
            ("name", "dtype", "shape", "status", "elements", "bytes"), param_rows, right=(4, 5)
        )
        if param_rows
        else "  (none)",
    ]
    totals = report["totals"]
    summary = (
        f"total: {totals['count']} parameters, {totals['elements']:,} elements, "
        f"{format_bytes(totals['bytes'])}"
    )
    for status in ("trainable", "frozen"):
        if status in totals:
            part = totals[status]
            summary += (
                f"; {status} {part['count']} ({part['elements']:,} elements, "
                f"{format_bytes(part['bytes'])})"
            )
    lines += ["", summary]
    lines += _tie_lines(report.get("ties", []))
    if report["kind"] != "model":
        state = report["optimizer_state"]
        lines.append(
            "optimizer state: "
            + (f"saved (step {state['step']})" if state["saved"] else "none (fresh checkpoint)")
        )
        if report["properties"]:
            shown = ", ".join(f"{k}={_short(v)}" for k, v in report["properties"].items())
            lines.append(f"properties: {shown}")
    base = report.get("base")
    if base:
        lines.append(
            f"frozen base: {base['file']} ({format_bytes(base['bytes'])}, {base['dtype']}), "
            "shared by the models"
        )
    for stage in report.get("staging", []):
        lines.append(
            f"staging folder {stage['path']} (pid {stage['pid']}, "
            f"{format_bytes(stage['bytes'])}): {stage['state']}"
        )
    return "\n".join(lines) + "\n"


def _tie_lines(ties: list[dict[str, Any]]) -> list[str]:
    lines = []
    for tie in ties:
        modules = ", ".join(tie["modules"])
        if tie["by_model"]:
            lines.append(f"tied by the model: {tie['initializer']} (read by {modules}), kept")
        else:
            copies = ", ".join(tie["copies"])
            lines.append(
                f"tied by the exporter: {tie['initializer']} (read by {modules}); --untie gives "
                f"{copies}"
            )
    return ["", *lines] if lines else []


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."
