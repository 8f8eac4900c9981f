"""Explore and explain ONNX training graphs in Jupyter.

Imported lazily (``import onnxblocks`` does not import it). Everything here is
pure Python: pictures are laid out by a small layered layout and drawn as
inline SVG, so they survive HTML export and need no graphviz.

* :func:`show` -- an HTML summary (inputs, outputs, parameters with sizes and
  totals) and a picture, for a ModelProto, a model file, an artifacts
  directory, a ModelAccessor, a Block, a TrainingBlock or Artifacts.
* :func:`repr_html` -- the HTML the ``_repr_html_`` hooks return.
* :func:`render` -- the renderer registry (``@render.register(MyClass)``) behind :func:`show`.
* :func:`summary_table` / :func:`summarize` -- the tables alone, or as data.
* :func:`draw_svg` -- the picture alone, with focused views (``view="backward"``,
  ``nodes=block.nodes``, ``around="fc1.weight", depth=2`` ...).
"""

from onnxblocks.display.graph import GraphIndex, NodeInfo, TensorInfo
from onnxblocks.display.rich import Display, draw_svg, register_html, render, repr_html, show
from onnxblocks.display.scene import MAX_NODES
from onnxblocks.display.summary import ModelSummary, Totals, format_bytes, summarize, summary_table
from onnxblocks.display.training import render_artifacts_dir
from onnxblocks.display.views import VIEWS, Selection, select

register_html()  # the core classes' _repr_html_ asks the registry, which these renderers answer

__all__ = [
    "MAX_NODES",
    "VIEWS",
    "Display",
    "GraphIndex",
    "ModelSummary",
    "NodeInfo",
    "Selection",
    "TensorInfo",
    "Totals",
    "draw_svg",
    "format_bytes",
    "render",
    "render_artifacts_dir",
    "repr_html",
    "select",
    "show",
    "summarize",
    "summary_table",
]
