"""The protobuf view of a build: the ``ModelProto`` that ``Block.base`` hands to user code.

The build itself is one ``ir.Model``. Code written for the reference API edits
``self.base`` in place (``self.base.graph.node.append(...)``), and protobuf tells nobody
of an edit, so the view keeps a shadow copy of itself: when the two differ before the
accessor's next read or write, the view was edited and the accessor reads it back. Each
write the accessor makes after the view was handed out is mirrored into both, so code
that keeps ``self.base`` sees the nodes added since, as it would with a live model.
Comparing the two is about half the cost of serializing the view (2.8 against 5.6 ms
for an 8,000-node model), and nothing is serialized per write.

The view is made on first use only: blocks that never touch ``base`` (every block,
loss and optimizer of the package) cost no conversion.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import onnx

from onnxblocks._core import limits as _limits
from onnxblocks.ir.proto import replace_field

_F = TypeVar("_F", bound=Callable[..., Any])


def one_view_check(method: _F) -> _F:
    """Check the protobuf view once per call of a writer's ``method``, not at each read it makes
    inside (an ``op`` reads names, types and opsets several times; no user code runs in between).

    The writer's ``_sync()`` reads an edited view back unless its ``_view_checked`` is set.
    """

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._view_checked:
            return method(self, *args, **kwargs)
        self._sync()
        self._view_checked = True
        try:
            return method(self, *args, **kwargs)
        finally:
            self._view_checked = False

    return checked  # type: ignore[return-value]


class ProtoView:
    """The one ``ModelProto`` view of a build, once handed out, and its shadow."""

    def __init__(self) -> None:
        self.proto: onnx.ModelProto | None = None
        self._shadow = onnx.ModelProto()

    def open(self, make: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
        """The view, made by ``make`` on first use."""
        if self.proto is None:
            self.proto = make()
            self._shadow.CopyFrom(self.proto)
        return self.proto

    def edited(self) -> onnx.ModelProto | None:
        """A copy of the view when code edited it since the last write, else None.

        The copy shares nothing with the view, so the build never sees later edits of
        the view except through this method.
        """
        if self.proto is None or self.proto == self._shadow:
            return None
        self._shadow.CopyFrom(self.proto)
        copy = onnx.ModelProto()
        copy.CopyFrom(self.proto)
        return copy

    # ---------------------------------------------------- writes mirrored into the view
    def add_node(self, node: onnx.NodeProto) -> None:
        """Mirror a node appended to the graph."""
        for model in self._both():
            model.graph.node.append(node)

    def amend_last_node(self, attributes: Sequence[onnx.AttributeProto], doc_string: str) -> None:
        """Mirror attributes and a doc string given to the last node."""
        for model in self._both():
            node = model.graph.node[-1]
            node.attribute.extend(attributes)
            if doc_string:
                node.doc_string = doc_string

    def add_input(self, info: onnx.ValueInfoProto) -> None:
        """Mirror a graph input appended."""
        for model in self._both():
            model.graph.input.append(info)

    def add_initializer(self, tensor: onnx.TensorProto) -> None:
        """Mirror an initializer appended."""
        for model in self._both():
            model.graph.initializer.append(tensor)

    def set_outputs(self, infos: Sequence[onnx.ValueInfoProto]) -> None:
        """Mirror the graph outputs replaced."""
        for model in self._both():
            replace_field(model.graph.output, infos)

    def ensure_opset(self, domain: str, version: int) -> None:
        """Mirror a domain imported."""
        for model in self._both():
            _limits.ensure_opset(model, domain, version)

    def replace(self, make: Callable[[], onnx.ModelProto]) -> None:
        """Mirror the whole model replaced (the same view object shows the new model)."""
        if self.proto is not None:
            self.proto.CopyFrom(make())
            self._shadow.CopyFrom(self.proto)

    def _both(self) -> tuple[onnx.ModelProto, ...]:
        """The view and its shadow, when the view was handed out (a write is mirrored in both)."""
        return () if self.proto is None else (self.proto, self._shadow)
