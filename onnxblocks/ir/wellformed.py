"""Whether a user's model is well formed enough to be read: each value defined once, each read
defined.

ONNX asks that every value have one definition (single static assignment) and that every
value a node reads be defined in its graph or an enclosing one. A model that breaks this
(an exporter bug, a hand edit) makes onnx-ir refuse it deep inside a build, and ONNX Runtime
refuse it with a message about its own graph. :func:`check_model` walks the protobuf once,
before anything else reads it, and names the first offenders: the value, the node that
defines or reads it (with the subgraph or function it is in), and the file.

The walk reads names only, never tensors, and does not import onnx-ir.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import onnx

from onnxblocks._core.errors import InvalidValueError

#: At most this many offenders are listed in one message.
_SHOWN = 5

_ADVICE = (
    "Each value must be defined once (by one node output, graph input or initializer) and "
    "defined before "
    "anything reads it. Fix the model where it is made (re-export it, or correct the hand edit) "
    "and try again."
)


def _node(node: onnx.NodeProto, index: int, where: str) -> str:
    name = f"'{node.name}'" if node.name else f"#{index}"
    return f"node {name} ({node.op_type}){where}"


def _subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for i, graph in enumerate(attr.graphs):
                yield f"{attr.name}[{i}]", graph


def _scope(
    inputs: Iterable[str],
    initializers: Iterable[str],
    nodes: Iterable[onnx.NodeProto],
    where: str,
    found: list[str],
) -> dict[str, str]:
    """Name -> what defines it, in one graph's own scope; redefinitions are added to ``found``."""
    defined: dict[str, str] = {}

    listed: dict[
        str, str
    ] = {}  # graph inputs and initializers: name -> "graph input" / "initializer"

    def define(name: str, by: str) -> None:
        if not name:
            return
        if name in defined:
            found.append(f"value '{name}' is defined twice: by {defined[name]} and by {by}")
        else:
            defined[name] = by

    for kind, names in (("graph input", inputs), ("initializer", initializers)):
        for name in names:
            if listed.get(name) == kind:
                found.append(f"{kind} '{name}'{where} is listed twice")
            elif (
                name not in listed
            ):  # an initializer of a graph input is its default value (IR < 4 style)
                listed[name] = kind
                define(name, f"the {kind}{where}")
    for index, node in enumerate(nodes):
        for name in node.output:
            define(name, _node(node, index, where))
    return defined


def _graph(graph: onnx.GraphProto, outer: dict[str, str], where: str, found: list[str]) -> None:
    initializers = [t.name for t in graph.initializer] + [
        t.values.name for t in graph.sparse_initializer
    ]
    own = _scope((v.name for v in graph.input), initializers, graph.node, where, found)
    visible = {
        **outer,
        **own,
    }  # a subgraph may define a name of an enclosing graph again (it shadows it)
    for index, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in visible:
                found.append(f"{_node(node, index, where)} reads '{name}', which nothing defines")
        for attribute, sub in _subgraphs(node):
            label = (
                f" in the subgraph '{attribute}' of "
                f"{_node(node, index, where).removesuffix(where)}{where}"
            )
            _graph(sub, visible, label, found)
    for value in graph.output:
        if value.name not in visible:
            found.append(
                f"graph output '{value.name}'{where} is defined by no node, graph input or "
                "initializer"
            )


def _function(function: onnx.FunctionProto, found: list[str]) -> None:
    where = f" in function '{function.name}' (domain '{function.domain}')"
    own = _scope(function.input, (), function.node, where, found)
    for index, node in enumerate(function.node):
        for name in node.input:
            if name and name not in own:
                found.append(f"{_node(node, index, where)} reads '{name}', which nothing defines")
    for name in function.output:
        if name not in own:
            found.append(f"function output '{name}'{where} is defined by no node or input")


def problems(model: onnx.ModelProto) -> list[str]:
    """What keeps ``model`` from being read, each naming its value and node (empty when well
    formed).
    """
    found: list[str] = []
    _graph(model.graph, {}, "", found)
    for function in model.functions:
        _function(function, found)
    return found


def describe(model: onnx.ModelProto | None, source: str | os.PathLike | None) -> str:
    """``"The model 'path'"``, ``"The model 'graph name'"`` or ``"The model"``, to begin a
    message.
    """
    if source is not None:
        return f"The model '{os.fspath(source)}'"
    if model is not None and model.graph.name:
        return f"The model (graph '{model.graph.name}')"
    return "The model"


def _refusal(
    found: list[str], model: onnx.ModelProto | None, source: str | os.PathLike | None
) -> InvalidValueError:
    listed = "; ".join(found[:_SHOWN]) + (
        f"; and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    )
    return InvalidValueError(f"{describe(model, source)} is not valid ONNX: {listed}. {_ADVICE}")


def check_model(model: onnx.ModelProto, source: str | os.PathLike | None = None) -> None:
    """Refuse a model that defines a value twice or reads one never defined, naming the offenders.

    Args:
        model: The model (not changed).
        source: The file it was read from, for the message.

    Raises:
        InvalidValueError: naming each value, the node that defines or reads it, and the file.
    """
    found = problems(model)
    if found:
        raise _refusal(found, model, source)


def unreadable(
    model: onnx.ModelProto, exc: BaseException, source: str | os.PathLike | None
) -> InvalidValueError:
    """The error for a model onnx-ir could not read (``exc``): its offenders if the walk finds them,
    else the cause.

    onnx-ir wraps the cause (which names the value and node) in one error per enclosing
    graph; the innermost one is reported.
    """
    found = problems(model)
    if found:
        return _refusal(found, model, source)
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    detail = " ".join(str(cause).split()) or type(cause).__name__
    return InvalidValueError(
        f"{describe(model, source)} cannot be read as an ONNX graph: {detail}. {_ADVICE}"
    )
