"""The protobuf view of a build: the ``ModelProto`` that ``Block.base`` hands to user code.

The build itself is one ``ir.Model``. Code written for the reference API edits
``self.base`` in place (``self.base.graph.node.append(...)``), and protobuf tells nobody
of an edit, so the view remembers its own bytes: when they differ before the accessor's
next read or write, the view was edited and the accessor reads it back. Each write the
accessor makes after the view was handed out is mirrored into it, so code that keeps
``self.base`` sees the nodes added since, as it would with a live model.

The view is made on first use only: blocks that never touch ``base`` (every block,
loss and optimizer of the package) cost no conversion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx

from onnxblocks._core import limits as _limits
from onnxblocks.ir.proto import replace_field


class ProtoView:
    """The one ``ModelProto`` view of a build, once handed out."""

    def __init__(self) -> None:
        self.proto: onnx.ModelProto | None = None
        self._bytes = b""

    def open(self, make: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
        """The view, made by ``make`` on first use."""
        if self.proto is None:
            self.proto = make()
            self._seal()
        return self.proto

    def edited(self) -> onnx.ModelProto | None:
        """A copy of the view when code edited it since the last write, else None.

        The copy shares nothing with the view, so the build never sees later edits of
        the view except through this method.
        """
        if self.proto is None:
            return None
        data = self.proto.SerializeToString()
        if data == self._bytes:
            return None
        self._bytes = data
        copy = onnx.ModelProto()
        copy.ParseFromString(data)
        return copy

    def _seal(self) -> None:
        assert self.proto is not None
        self._bytes = self.proto.SerializeToString()

    # ---------------------------------------------------- writes mirrored into the view
    def add_node(self, node: onnx.NodeProto) -> None:
        """Mirror a node appended to the graph."""
        if self.proto is not None:
            self.proto.graph.node.append(node)
            self._seal()

    def amend_last_node(self, attributes: Sequence[onnx.AttributeProto], doc_string: str) -> None:
        """Mirror attributes and a doc string given to the last node."""
        if self.proto is not None:
            node = self.proto.graph.node[-1]
            node.attribute.extend(attributes)
            if doc_string:
                node.doc_string = doc_string
            self._seal()

    def add_input(self, info: onnx.ValueInfoProto) -> None:
        """Mirror a graph input appended."""
        if self.proto is not None:
            self.proto.graph.input.append(info)
            self._seal()

    def add_initializer(self, tensor: onnx.TensorProto) -> None:
        """Mirror an initializer appended."""
        if self.proto is not None:
            self.proto.graph.initializer.append(tensor)
            self._seal()

    def set_outputs(self, infos: Sequence[onnx.ValueInfoProto]) -> None:
        """Mirror the graph outputs replaced."""
        if self.proto is not None:
            replace_field(self.proto.graph.output, infos)
            self._seal()

    def ensure_opset(self, domain: str, version: int) -> None:
        """Mirror a domain imported."""
        if self.proto is not None:
            _limits.ensure_opset(self.proto, domain, version)
            self._seal()

    def replace(self, make: Callable[[], onnx.ModelProto]) -> None:
        """Mirror the whole model replaced (the same view object shows the new model)."""
        if self.proto is not None:
            self.proto.CopyFrom(make())
            self._seal()
