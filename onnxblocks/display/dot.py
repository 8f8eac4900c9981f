"""Optional graphviz ``dot`` layout of a scene (used only with ``engine="dot"``).

The built-in layout (:mod:`onnxblocks.display.layout`) needs nothing installed;
this module hands the same boxes and edges to graphviz's ``dot`` program when
it is on ``PATH``.
"""

from __future__ import annotations

import shutil
import subprocess

from onnxblocks._core.errors import FileMissingError, StateError
from onnxblocks.display.scene import Scene
from onnxblocks.display.svg import STYLES, shorten


def dot_available() -> bool:
    """True when graphviz's ``dot`` program is on PATH."""
    return shutil.which("dot") is not None


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def scene_to_dot(scene: Scene) -> str:
    """The scene as DOT source text."""
    lines = [
        "digraph G {",
        '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10];',
    ]
    if scene.caption:
        lines.append(f"  label={_quote(scene.caption)}; labelloc=t; fontsize=10;")
    for box in scene.boxes:
        fill, stroke, dash, _, _ = STYLES.get(box.kind, STYLES["forward"])
        style = "rounded,filled" + (",dashed" if dash else "")
        label = shorten(box.title, 30) + ("\n" + shorten(box.subtitle, 38) if box.subtitle else "")
        extra = ", penwidth=2.5" if box.emphasis else ""
        extra += ', fontcolor="#94a3b8"' if box.dim else ""
        lines.append(
            f"  {_quote(box.key)} [label={_quote(label)}, "
            f"tooltip={_quote(box.tooltip or box.title)}, "
            f'fillcolor="{fill}", color="{stroke}", style="{style}"{extra}];'
        )
    for a, b in scene.edges:
        lines.append(f"  {_quote(a)} -> {_quote(b)};")
    lines.append("}")
    return "\n".join(lines)


def scene_to_dot_svg(scene: Scene, timeout: float = 60.0) -> str:
    """Lay out and draw the scene with graphviz ``dot``.

    Raises:
        FileNotFoundError: if ``dot`` is not on PATH.
        RuntimeError: if ``dot`` fails.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise FileMissingError(
            "graphviz 'dot' is not on PATH; install graphviz or use engine='python'."
        )
    result = subprocess.run(
        [exe, "-Tsvg"],
        input=scene_to_dot(scene).encode(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise StateError(f"graphviz 'dot' failed: {result.stderr.decode(errors='replace').strip()}")
    text = result.stdout.decode()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text
