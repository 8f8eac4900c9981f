"""Read ONNX Runtime's error messages: clean them for people, and extract the few facts onnxblocks
acts on.

ONNX Runtime wraps the sentence that matters in C++ plumbing:

* a source location and the C++ function signature, at the start or nested in
  the message (``/onnxruntime_src/.../model.cc:180 onnxruntime::Model::Model(...) ``,
  ``... Status Message: /onnxruntime_src/.../reshape_helper.h:45 ...``);
* a short location, file and function name (``module.cc:80 TransformModelOutputsForInference ``);
* the condition of a failed ``ORT_ENFORCE`` (``gradient_builder != nullptr was false. ``);
* a status prefix (``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ``).

:func:`clean_message` removes all four and joins the lines. The parsers read a
message (cleaned or not) for the facts the gradient builder explains:
:func:`missing_gradient` (an op without a gradient builder, and its node),
:func:`unreachable_value` (a value the loss does not depend on) and
:func:`missing_kernel` (a node the CPU build has no kernel for). Nothing here
imports onnxruntime: messages are text, exceptions are recognised by their class.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from onnxblocks._core.errors import OrtRunError

#: Names of ONNX Runtime exception classes that mean "your model or input is wrong".
INPUT_ERROR_CLASSES = frozenset(
    {
        "InvalidArgument",
        "NoSuchFile",
        "NoModel",
        "InvalidProtobuf",
        "InvalidGraph",
        "NotImplemented",
    }
)

#: ``[ONNXRuntimeError] : <code> : <STATUS NAME> : `` (the status name is left out by some
#: bindings).
_STATUS_PREFIX = re.compile(r"\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*(?:[A-Z_]+\s*:\s*)?")
#: ``<path>/<file>.<ext>:<line> ``, at the start of the text or after a space.
_LOCATION = re.compile(
    r"(?:^|(?<=\s))(?P<path>(?:[\w.+-]*[/\\])*)[\w.+-]+\.(?:cc|cpp|cxx|c|h|hpp|cu|cuh):\d+ "
)
#: The condition of a failed ``ORT_ENFORCE`` right after its signature (it does not span sentences).
_ENFORCE_CONDITION = re.compile(r"(?:(?!\. |\[ONNXRuntimeError\]).)*? was false\.(?: |$)")
#: What may follow a C++ parameter list inside a signature.
_QUALIFIER = re.compile(r" (?:const|volatile|noexcept|override|&&?)(?=[ \[]|$)")
#: Longest C++ signature skipped (a longer one is left in place rather than eating the message).
_MAX_SIGNATURE = 2000

_NOT_REGISTERED = re.compile(r"has not been registered: (\S+) for node ?(\S*)")
#: Two forms: no path at all to the value, or none through ops with a gradient (a value read only by
#: ``Shape``).
_UNREACHABLE = re.compile(
    r"Cannot compute the partial derivative for '([^']+)'|(?:^|\s)(\S+) couldn't find the "
    r"consumer node"
)
_NO_KERNEL = re.compile(
    r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'"
)


class MissingGradient(NamedTuple):
    """ONNX Runtime has no gradient builder for an op.

    Attributes:
        op_type: The op type (``Round``).
        node: The node's name; empty for an unnamed node.
    """

    op_type: str
    node: str


class MissingKernel(NamedTuple):
    """ONNX Runtime's build has no kernel for a node of a model it loads.

    Attributes:
        op_type: The op type (``ConvTransposeGrad``).
        node: The node's name (``up_Grad/ConvTransposeGrad_0``).
    """

    op_type: str
    node: str


def run_error(error: BaseException, what: str) -> OrtRunError:
    """The one translation of an ONNX Runtime failure while running a model, for every backend and
    ``torch``.

    Args:
        error: What ONNX Runtime raised.
        what: What was being run, for the message (``"the training model"``); empty for none.

    Returns:
        An :class:`~onnxblocks.errors.OrtRunError` with the cleaned message (raise it
        ``from None``: ONNX Runtime's own text carries C++ locations), whose
        ``input_error`` says whether ONNX Runtime blamed the model or its inputs
        (:func:`is_input_error`).
    """
    prefix = f"ONNX Runtime failed running {what}: " if what else ""
    message = clean_message(error).removeprefix(
        "Error in execution: "
    )  # onnxruntime's Python layer adds it
    translated = OrtRunError(prefix + message)
    translated.input_error = is_input_error(error)
    return translated


def clean_message(error: BaseException | str) -> str:
    """An ONNX Runtime error message on one line, without source locations, C++ signatures and
    status prefixes.

    Args:
        error: An exception raised by ONNX Runtime, or its message.

    Returns:
        The cleaned message; the message on one line when cleaning would leave nothing.
    """
    text = " ".join(str(error).split())
    parts: list[str] = []
    position = 0
    for match in _LOCATION.finditer(text):
        if match.start() < position:  # inside a signature already skipped
            continue
        parts.append(text[position : match.start()])
        position = _skip_function(text, match.end(), long_form=bool(match.group("path")))
        condition = _ENFORCE_CONDITION.match(text, position)
        if condition:
            position = condition.end()
    parts.append(text[position:])
    cleaned = _STATUS_PREFIX.sub("", "".join(parts))
    return " ".join(cleaned.split()) or text


def _skip_function(text: str, start: int, long_form: bool) -> int:
    """The position after the function a location names: a full C++ signature, or one name (short
    form).

    ONNX Runtime's exceptions print the full path and ``__PRETTY_FUNCTION__``
    (return type, qualified name, parameter list, qualifiers, ``::<lambda(...)>``,
    ``[with T = ...]``); the statuses of ``ORT_RETURN_IF`` print the file name and
    ``__FUNCTION__`` (one word).
    """
    if not long_form:
        space = text.find(" ", start)
        return len(text) if space < 0 else space + 1
    depth = 0
    called = False
    i = start
    end = min(len(text), start + _MAX_SIGNATURE)
    while i < end:
        c = text[i]
        if c in "(<":
            depth += 1
        elif c in ")>" and depth:
            depth -= 1
            called = called or (depth == 0 and c == ")")
        elif c == " " and depth == 0 and called:
            qualifier = _QUALIFIER.match(text, i)
            if qualifier:
                i = qualifier.end()
                continue
            if text.startswith(" [with ", i):
                close = text.find("]", i)
                i = end if close < 0 else close + 1
                continue
            return i + 1
        i += 1
    if called and i >= len(text):
        return len(text)
    return start  # not a signature we can read: leave it


def is_ort_error(exc: BaseException) -> bool:
    """True when ``exc`` was raised by ONNX Runtime's bindings (its class comes from
    onnxruntime).
    """
    return type(exc).__module__.startswith("onnxruntime")


def is_input_error(exc: BaseException) -> bool:
    """True for ONNX Runtime errors that blame the model or the input rather than the runtime."""
    return is_ort_error(exc) and type(exc).__name__ in INPUT_ERROR_CLASSES


def missing_gradient(error: BaseException | str) -> MissingGradient | None:
    """The op (and node) without a gradient builder that the gradient builder's ``error``
    reports, else None.
    """
    match = _NOT_REGISTERED.search(clean_message(error))
    return MissingGradient(*match.groups()) if match else None


def unreachable_value(error: BaseException | str) -> str | None:
    """The value whose gradient the builder's ``error`` says the loss cannot reach, else None."""
    match = _UNREACHABLE.search(clean_message(error))
    return (match.group(1) or match.group(2)) if match else None


def missing_kernel(error: BaseException | str) -> MissingKernel | None:
    """The op and node that ``error`` (from loading a session) says have no kernel, else None."""
    match = _NO_KERNEL.search(clean_message(error))
    return MissingKernel(*match.groups()) if match else None
