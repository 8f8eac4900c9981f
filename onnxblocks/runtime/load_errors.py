"""The error for a portable model the installed onnxruntime cannot load.

ONNX Runtime says it has no kernel for a node in one of two wordings; :func:`load_error`
turns either into a :class:`~onnxblocks.errors.PortabilityError` that names the op and the
node and says what to do (the artifacts are portable already: regenerating them the same
way would not help).
"""

from __future__ import annotations

import re

from onnxblocks._core.errors import PortabilityError

#: How ONNX Runtime says it has no kernel for a node (its two wordings), capturing the op and the
#: node.
_NO_KERNEL = re.compile(
    r"(?:Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'"
    r"|Failed to find kernel for (\w+)\(\d+\) \(node:'([^']*)')"
)


def load_error(version: str, what: str, source: str | bytes, message: str) -> PortabilityError:
    """The error for a portable model this onnxruntime cannot load, naming the op without a kernel
    when it is one.

    The artifacts are portable already: regenerating them the same way would not help.
    """
    where = f" '{source}'" if isinstance(source, str) else ""
    match = _NO_KERNEL.search(message)
    if match is None:
        return PortabilityError(
            f"onnxruntime {version} cannot load the {what}{where}: {message}. The file is not a "
            "model of these "
            "portable artifacts, or it is damaged: regenerate the artifacts "
            "(generate_artifacts(..., portable=True))."
        )
    op_type, node = (
        (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    )
    return PortabilityError(
        f"onnxruntime {version} has no kernel for {op_type} (node '{node}') of the "
        f"{what}{where}, for the element "
        f"types these portable artifacts use ({message}). Generation refuses the options it "
        "knows ONNX Runtime "
        "cannot run (docs/losses.md, 'Loss options and dtypes'); for this one, use float32 "
        "values for the part of "
        "the model around that node, or train on the training build (portable=False)."
    )
