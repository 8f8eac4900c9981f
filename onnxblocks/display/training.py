"""Displays of training: TrainingBlocks, Artifacts, and artifact directories or model files on disk.

Each renderer registers itself on :func:`onnxblocks.display.rich.render`. Which
parameters train is read from the checkpoint's metadata with the package's own
checkpoint reader (no tensor data is read), or from the objects themselves.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import onnx

from onnxblocks._core.contracts import (
    CHECKPOINT,
    MODEL_STEMS,
    ONNX_SUFFIX,
    ArtifactNames,
    accumulated_name,
    buffer_name,
    gradient_name,
)
from onnxblocks._core.errors import CheckpointFormatError, FileMissingError, InvalidValueError
from onnxblocks.artifacts import Artifacts
from onnxblocks.blocks.block import added_nodes
from onnxblocks.blocks.training import TrainingBlock
from onnxblocks.checkpoint import check_checkpoint
from onnxblocks.display.graph import GraphIndex
from onnxblocks.display.rich import (
    BOX,
    Display,
    count_noun,
    details,
    draw_svg,
    not_built,
    picture,
    render,
    show_model,
    split_view,
)
from onnxblocks.display.summary import TABLE, TD, TDR, TH, format_bytes, header_line, summary_table
from onnxblocks.io import load_model

#: Artifact files, in display order (a prefix may come before each name).
ARTIFACT_FILES = (*(ArtifactNames().model(stem) for stem in MODEL_STEMS), CHECKPOINT)


@render.register(str)
@render.register(os.PathLike)
def _show_path(path: str | os.PathLike, **view: Any) -> Display:
    path = Path(path)
    if path.is_dir():
        return render_artifacts_dir(path, **view)
    if not path.is_file():
        raise FileMissingError(
            f"'{path}' does not exist. Pass an .onnx file or a directory of training artifacts."
        )
    model = load_model(path)
    return show_model(
        model, title=f"{escape(path.name)} ({format_bytes(path.stat().st_size)})", **view
    )


def _gradient_table(index: GraphIndex) -> str:
    """Rows ``param -> gradient -> accumulation buffer -> accumulated output`` of a training
    graph.
    """
    produced = set(index.producer)
    inputs = {t.name for t in index.state} | {t.name for t in index.inputs}
    outputs = {t.name for t in index.outputs}
    rows = []
    trainable = [p for p in index.params if p.trainable]
    for p in trainable[:50]:
        grad, buf, out = gradient_name(p.name), buffer_name(p.name), accumulated_name(p.name)

        def cell(value: str, present: bool) -> str:
            return f'<td style="{TD}">{escape(value) if present else "—"}</td>'

        rows.append(
            "<tr><td "
            f'style="{TD}">{escape(p.name)}</td>{cell(grad, grad in produced or grad in outputs)}'
            f"{cell(buf, buf in inputs)}{cell(out, out in outputs)}</tr>"
        )
    if not rows:
        return "<div>No gradients: this graph has no trainable parameter.</div>"
    more = (
        f'<tr><td colspan="4" style="{TD}">… {len(trainable) - 50:,} more</td></tr>'
        if len(trainable) > 50
        else ""
    )
    return (
        f'<div style="margin-top:6px"><b>Gradients</b> ({len(trainable):,})</div>'
        f'<table style="{TABLE}"><thead><tr><th style="{TH}">parameter</th><th '
        f'style="{TH}">gradient</th>'
        f'<th style="{TH}">accumulation buffer (input)</th><th style="{TH}">accumulated '
        "(output)</th></tr></thead>"
        f"<tbody>{''.join(rows)}{more}</tbody></table>"
    )


def _training_display(
    title: str,
    models: dict[str, onnx.ModelProto],
    trainable: Iterable[str] | None,
    frozen: Iterable[str] | None,
    files: str = "",
    notes: Sequence[str] = (),
    loss: str | None = None,
    loss_nodes: Sequence[str] | None = None,
    **view: Any,
) -> Display:
    """Shared display of a training model with its eval and optimizer models."""
    pic, rest = split_view(view)
    main = rest.get("model", "training")
    if main not in models:
        raise InvalidValueError(
            f"model={main!r} is not available here; choose one of {sorted(models)}."
        )
    trainable = list(trainable) if trainable is not None else None
    frozen = list(frozen) if frozen is not None else None
    indexes = {
        k: GraphIndex(
            m,
            trainable,
            frozen,
            loss="" if k == "optimizer" else loss,
            loss_nodes=None if k == "optimizer" else loss_nodes,
        )
        for k, m in models.items()
    }
    out = [
        f'<div style="{BOX}"><div style="font-size:13px;margin-bottom:4px"><b>{title}</b></div>',
        files,
    ]
    out.extend(f'<div style="color:#64748b">{escape(n)}</div>' for n in notes)
    train = indexes.get("training")
    if train is not None:
        out.append(summary_table(train))
        out.append(_gradient_table(train))
    svg = draw_svg(indexes[main], **pic)
    out.append(f"<div style='margin-top:6px'><b>{escape(main)} model</b></div>")
    if main != "training":
        out.append(header_line(indexes[main]))
    out.append(picture(svg))
    for kind, index in indexes.items():
        if kind == main:
            continue
        body = header_line(index)
        if kind != "optimizer" and train is not None:
            only = _compare_io(train, index)
            if only:
                body += f'<div style="color:#475569">{only}</div>'
        small = {k: v for k, v in pic.items() if k not in ("nodes", "around")}
        body += picture(draw_svg(index, **small))
        out.append(details(f"{escape(kind)} model ({count_noun(len(index.nodes), 'node')})", body))
    out.append("</div>")
    return Display("".join(out), svg)


def _compare_io(train: GraphIndex, other: GraphIndex) -> str:
    t_in = {t.name for t in train.inputs + train.params + train.state}
    o_in = {t.name for t in other.inputs + other.params + other.state}
    t_out = {t.name for t in train.outputs}
    o_out = {t.name for t in other.outputs}
    bits = []
    if t_in - o_in:
        bits.append(f"inputs only in training: {len(t_in - o_in)}")
    if t_out - o_out:
        bits.append(f"outputs only in training: {len(t_out - o_out)} (gradients / accumulation)")
    return escape(" · ".join(bits))


@render.register(TrainingBlock)
def _show_training_block(block: TrainingBlock, **view: Any) -> Display:
    name = escape(type(block).__name__)
    if not block.is_built:
        return not_built(name, " (training block)", "to build the training and eval models")
    graphs = block.training_graphs()
    partition = graphs.partition
    trainable, frozen = list(partition.trainable), list(partition.frozen)
    title = (
        f"{name}: training and eval models · {len(trainable):,} trainable, {len(frozen):,} "
        "frozen parameter(s)"
        f" · loss <code>{escape(graphs.user_outputs[0])}</code>"
    )
    return _training_display(
        title,
        {"training": graphs.training, "eval": graphs.eval},
        trainable,
        frozen,
        loss=graphs.user_outputs[0],
        loss_nodes=added_nodes(block),
        **view,
    )


def _find_artifacts(directory: Path) -> dict[str, Path]:
    """The artifact files of a directory, by unprefixed name; the shortest prefix wins."""
    found: dict[str, Path] = {}
    for kind in ARTIFACT_FILES:
        matches = sorted(p for p in directory.iterdir() if p.name.endswith(kind))
        if matches:
            found[kind] = min(matches, key=lambda p: len(p.name))
    return found


def _model_key(file_name: str) -> str:
    """``training_model.onnx`` -> ``training`` (the key ``show(model=...)`` takes)."""
    return file_name.removesuffix(ONNX_SUFFIX).removesuffix("_model")


def _checkpoint_params(
    path: Path, model: onnx.ModelProto | None
) -> tuple[list[str], list[str]] | None:
    """(trainable, frozen) parameter names of a checkpoint; None when it is unreadable or another
    model's.

    The checkpoint is checked completely, and against the training model, from its metadata alone.
    """
    try:
        parsed = check_checkpoint(path, model)
    except (OSError, CheckpointFormatError):  # fall back to what the graph says
        return None
    return [e.name for e in parsed.trainable], [e.name for e in parsed.frozen]


def _checkpoint_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    siblings = [p for p in path.parent.iterdir() if p.name.startswith(path.name) and p.is_file()]
    return sum(p.stat().st_size for p in siblings)


def _files_table(found: dict[str, Path], models: dict[str, onnx.ModelProto]) -> str:
    rows = []
    for kind, path in found.items():
        model = models.get(_model_key(kind))
        size = _checkpoint_size(path) if kind == CHECKPOINT else path.stat().st_size
        info = (
            (
                f"{count_noun(len(model.graph.node), 'node')}, "
                f"{count_noun(len(model.graph.input), 'input')}, "
                f"{count_noun(len(model.graph.output), 'output')}"
            )
            if model is not None
            else ""
        )
        rows.append(
            f'<tr><td style="{TD}">{escape(path.name)}</td><td style="{TDR}">{size:,}</td>'
            f'<td style="{TD}">{format_bytes(size)}</td><td style="{TD}">{info}</td></tr>'
        )
    return (
        f'<table style="{TABLE}"><thead><tr><th style="{TH}">file</th><th style="{TH}">bytes</th>'
        f'<th style="{TH}"></th><th '
        f'style="{TH}">graph</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def render_artifacts_dir(
    directory: Path,
    trainable: Iterable[str] | None = None,
    frozen: Iterable[str] | None = None,
    **view: Any,
) -> Display:
    """The display of a directory of training artifacts (any prefix; the shortest wins).

    Raises:
        FileNotFoundError: if the directory holds no training model.
    """
    from onnxblocks._core.errors import LockTimeoutError
    from onnxblocks._core.leftovers import clean

    with contextlib.suppress(
        LockTimeoutError
    ):  # what killed generate_artifacts runs left goes first
        clean(directory, lock_timeout=5.0)
    found = _find_artifacts(directory)
    if ArtifactNames().training_model not in found:
        raise FileMissingError(
            f"'{directory}' has no training_model.onnx. Pass the directory generate_artifacts() "
            "wrote to, "
            "or an .onnx file."
        )
    return _show_found(directory, found, trainable, frozen, **view)


def _show_found(
    directory: Path,
    found: dict[str, Path],
    trainable: Iterable[str] | None,
    frozen: Iterable[str] | None,
    loss: str | None = None,
    **view: Any,
) -> Display:
    models = {
        _model_key(kind): load_model(path)
        for kind, path in found.items()
        if kind.endswith(ONNX_SUFFIX)
    }
    notes: list[str] = []
    if trainable is None and frozen is None and CHECKPOINT in found:
        params = _checkpoint_params(found[CHECKPOINT], models.get("training"))
        if params is None:
            notes.append(
                "The checkpoint could not be read, or belongs to another model: frozen "
                "parameters show as inputs."
            )
        else:
            trainable, frozen = params
    title = f"Training artifacts in {escape(str(directory))}"
    return _training_display(
        title, models, trainable, frozen, _files_table(found, models), notes, loss=loss, **view
    )


@render.register(Artifacts)
def _show_artifacts(artifacts: Artifacts, **view: Any) -> Display:
    """Display an ``onnxblocks.artifacts.Artifacts`` (paths and parameter names are known)."""
    unprefixed = ArtifactNames()
    found = {
        unprefixed.training_model: Path(artifacts.training_model),
        unprefixed.eval_model: Path(artifacts.eval_model),
    }
    if artifacts.optimizer_model is not None:
        found[unprefixed.optimizer_model] = Path(artifacts.optimizer_model)
    found[unprefixed.checkpoint] = Path(artifacts.checkpoint)
    missing = [str(p) for p in found.values() if not p.exists()]
    if missing:
        raise FileMissingError(
            f"Artifact file(s) {missing} no longer exist. Generate the artifacts again, or "
            "show() the directory "
            "that holds them."
        )
    trainable = view.pop("trainable", list(artifacts.requires_grad))
    frozen = view.pop("frozen", list(artifacts.frozen_params))
    loss = artifacts.output_names[0] if artifacts.output_names else None
    return _show_found(Path(artifacts.directory), found, trainable, frozen, loss=loss, **view)
