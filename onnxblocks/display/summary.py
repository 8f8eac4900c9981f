"""Tables of a model's inputs, outputs and parameters, with totals, as data and as HTML.

:func:`summarize` reads a model (no weight bytes) into a :class:`ModelSummary`;
:func:`summary_table` renders it as an HTML fragment with inline styles (it
survives HTML export and needs no stylesheet).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

import onnx

from onnxblocks.display.graph import GraphIndex, TensorInfo

TIMES = "\u00d7"  # multiplication sign, as in MatMul (times) 4

#: Parameter rows shown before the table is cut (totals always cover all rows).
MAX_ROWS = 50

TABLE = "border-collapse:collapse;margin:4px 0 10px 0;font-size:12px"
TH = "text-align:left;padding:2px 8px;border-bottom:1px solid #94a3b8;background:#f1f5f9"
TD = (
    "text-align:left;padding:2px 8px;border-bottom:1px solid "
    "#e2e8f0;font-family:ui-monospace,Menlo,Consolas,monospace"
)
TDR = TD + ";text-align:right"
TOTAL = "padding:2px 8px;border-top:2px solid #94a3b8;font-weight:bold"
BOX = (
    "font-family:system-ui,-apple-system,Segoe "
    "UI,Roboto,sans-serif;font-size:12px;color:#0f172a;line-height:1.4"
)


@dataclass(frozen=True)
class Totals:
    """Count, elements and bytes of a set of tensors (unknown sizes count as 0)."""

    count: int
    elements: int
    nbytes: int

    @classmethod
    def of(cls, tensors: Iterable[TensorInfo]) -> Totals:
        """Totals of ``tensors``."""
        items = list(tensors)
        return cls(len(items), sum(t.numel or 0 for t in items), sum(t.nbytes or 0 for t in items))


@dataclass(frozen=True)
class ModelSummary:
    """What a model takes, returns and learns.

    Attributes:
        index: The graph index the summary was made from.
        params: Totals over all parameters.
        trainable: Totals over trainable parameters.
        frozen: Totals over frozen parameters.
        unknown: Totals over parameters whose status is not known.
        constants: Totals over constant initializers (not parameters).
    """

    index: GraphIndex
    params: Totals
    trainable: Totals
    frozen: Totals
    unknown: Totals
    constants: Totals


def summarize(
    model: onnx.ModelProto | GraphIndex,
    trainable: Iterable[str] | None = None,
    frozen: Iterable[str] | None = None,
) -> ModelSummary:
    """Summarize a model's inputs, outputs and parameters.

    Args:
        model: The model, or a :class:`GraphIndex` of it.
        trainable: Names of trainable parameters (by default guessed, see :class:`GraphIndex`).
        frozen: Names of frozen parameters.

    Returns:
        The summary.
    """
    index = model if isinstance(model, GraphIndex) else GraphIndex(model, trainable, frozen)
    params = index.params
    return ModelSummary(
        index,
        Totals.of(params),
        Totals.of(p for p in params if p.trainable is True),
        Totals.of(p for p in params if p.trainable is False),
        Totals.of(p for p in params if p.trainable is None),
        Totals.of(index.constants),
    )


def format_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"?"``."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n:,} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n:,} B"  # pragma: no cover


def _status(t: TensorInfo) -> str:
    return {True: "trainable", False: "frozen", None: "?"}[t.trainable]


def _rows(tensors: list[TensorInfo], columns: list[str], limit: int) -> list[str]:
    rows = []
    for t in tensors[:limit]:
        cells = {
            "name": escape(t.name),
            "dtype": escape(t.dtype),
            "shape": escape(t.shape_text),
            "elements": "?" if t.numel is None else f"{t.numel:,}",
            "bytes": "?" if t.nbytes is None else f"{t.nbytes:,}",
            "status": _status(t),
        }
        tds = "".join(
            f'<td style="{TDR if c in ("elements", "bytes") else TD}">{cells[c]}</td>'
            for c in columns
        )
        rows.append(f"<tr>{tds}</tr>")
    if len(tensors) > limit:
        rows.append(
            f'<tr><td colspan="{len(columns)}" style="{TD};color:#64748b">… '
            f"{len(tensors) - limit:,} more "
            "(totals below cover all)</td></tr>"
        )
    return rows


def _table(
    title: str,
    tensors: list[TensorInfo],
    columns: list[str],
    limit: int,
    total: Totals | None = None,
) -> str:
    if not tensors:
        return f'<div style="margin:4px 0"><b>{escape(title)}</b>: none</div>'
    head = "".join(f'<th style="{TH}">{c}</th>' for c in columns)
    body = "".join(_rows(tensors, columns, limit))
    foot = ""
    if total is not None:
        cells = []
        for c in columns:
            if c == "name":
                cells.append(f'<td style="{TOTAL}">total: {total.count:,}</td>')
            elif c == "elements":
                cells.append(f'<td style="{TOTAL};text-align:right">{total.elements:,}</td>')
            elif c == "bytes":
                cells.append(f'<td style="{TOTAL};text-align:right">{total.nbytes:,}</td>')
            else:
                cells.append(f'<td style="{TOTAL}"></td>')
        foot = "<tr>" + "".join(cells) + "</tr>"
    return (
        f'<div style="margin-top:6px"><b>{escape(title)}</b> ({len(tensors):,})</div>'
        f'<table style="{TABLE}"><thead><tr>{head}</tr></thead><tbody>{body}{foot}</tbody></table>'
    )


def header_line(index: GraphIndex) -> str:
    """One line naming the graph, its size, opsets and parts (HTML)."""
    model = index.model
    bits = [f"{len(index.nodes):,} node" + ("" if len(index.nodes) == 1 else "s")]
    if model is not None:
        opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
        bits.append(f"opsets: {escape(opsets)}")
        bits.append(f"IR {model.ir_version}")
    parts = index.part_counts()
    if len(parts) > 1 or (parts and "forward" not in parts):
        bits.append("parts: " + ", ".join(f"{p} {n:,}" for p, n in parts.items()))
    if index.loss:
        bits.append(f"loss: <code>{escape(index.loss)}</code>")
    name = escape(index.graph_name or "graph")
    return f"<div><b>graph '{name}'</b> · " + " · ".join(bits) + "</div>"


def summary_table(
    model: onnx.ModelProto | GraphIndex,
    trainable: Iterable[str] | None = None,
    frozen: Iterable[str] | None = None,
    max_rows: int = MAX_ROWS,
    header: bool = True,
) -> str:
    """HTML tables of a model's inputs, outputs and parameters, with totals.

    Args:
        model: The model (weight bytes are not read), or a :class:`GraphIndex`.
        trainable: Names of trainable parameters; by default guessed (see :class:`GraphIndex`).
        frozen: Names of frozen parameters.
        max_rows: Parameter rows shown before the table is cut; totals still cover all.
        header: Start with a line naming the graph and its size.

    Returns:
        An HTML fragment.
    """
    s = summarize(model, trainable, frozen)
    index = s.index
    out = [f'<div class="onnxblocks-summary" style="{BOX}">']
    if header:
        out.append(header_line(index))
        ops = index.op_counts()
        if ops:
            shown = ", ".join(f"{escape(op)}{TIMES}{n}" for op, n in list(ops.items())[:12])
            out.append(
                f'<div style="color:#475569">ops: {shown}{" …" if len(ops) > 12 else ""}</div>'
            )
    io_cols = ["name", "dtype", "shape", "bytes"]
    out.append(_table("Inputs", index.inputs, io_cols, max_rows))
    out.append(_table("Outputs", index.outputs, io_cols, max_rows))
    param_cols = ["name", "dtype", "shape", "elements", "bytes", "status"]
    out.append(_table("Parameters", index.params, param_cols, max_rows, s.params))
    line = []
    for label, tot in (
        ("trainable", s.trainable),
        ("frozen", s.frozen),
        ("status unknown", s.unknown),
    ):
        if tot.count:
            line.append(
                f"{label}: {tot.count:,} ({tot.elements:,} elements, {format_bytes(tot.nbytes)})"
            )
    if s.constants.count:
        line.append(
            f"constants (not parameters): {s.constants.count:,} "
            f"({format_bytes(s.constants.nbytes)})"
        )
    if index.state:
        line.append(
            "gradient state inputs: "
            + ", ".join(f"<code>{escape(t.name)}</code>" for t in index.state[:6])
            + (" …" if len(index.state) > 6 else "")
        )
    if line:
        out.append("<div>" + " · ".join(line) + "</div>")
    if s.unknown.count:
        out.append(
            '<div style="color:#64748b">Status "?" : this model does not say which parameters '
            "train; pass "
            "trainable=/frozen= to summary_table, or look at the training artifacts.</div>"
        )
    out.append("</div>")
    return "".join(out)
