"""The model accessor: the model a build adds nodes to, with its names, types and held weights.

:class:`ModelAccessor` is the build: its one ``ir.Model``, which
:class:`~onnxblocks.blocks.graph_writer.GraphWriter` adds nodes, graph inputs,
initializers, constants and outputs to, the held weights, and the finished model once
the build ends. Opening a build (``base`` / ``empty_base``) lives in
:mod:`onnxblocks.blocks.opening`.

Validation model: each node added through :meth:`GraphWriter.op` is checked on
its own (:func:`onnxblocks.blocks.checking.check_node`). The whole model is
checked once, when it is finished (:meth:`ModelAccessor.finish`), on a skeleton
that holds no weight bytes.

The protobuf view: code written for the reference API edits ``Block.base`` (a
``ModelProto``) in place. :attr:`ModelAccessor.working_model` hands out one view of
the build, made on first use and kept in step with every write the accessor makes
after it; an edit made to the view (found by comparing it with a shadow copy) is read
back before the accessor's next read or write. A build whose blocks
never touch the view converts nothing until it is finished.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir

from onnxblocks._core import active_build as _context
from onnxblocks._core import limits as _limits
from onnxblocks._core import weights as _weights
from onnxblocks._core.errors import StateError, UnknownNameError, did_you_mean
from onnxblocks._core.html import HtmlDisplay
from onnxblocks._core.validation import check_skeleton
from onnxblocks.blocks.graph_writer import GraphWriter


class ModelAccessor(GraphWriter, HtmlDisplay):
    """Holds the model a build adds nodes to, with its names, types and held weights.

    Attributes:
        weights: The :class:`~onnxblocks._core.weights.WeightStore` of held initializers.
        names: The graph's :class:`~onnxblocks._core.naming.NameAuthority`.
    """

    def __init__(
        self,
        model: onnx.ModelProto | ir.Model,
        model_path: str | os.PathLike | None = None,
        store: _weights.WeightStore | None = None,
    ) -> None:
        self._path = os.fspath(model_path) if model_path is not None else None
        self.weights = store if store is not None else _weights.WeightStore()
        self._open = True
        self._finished_cache: onnx.ModelProto | None = None
        super().__init__(model)

    @property
    def model(self) -> onnx.ModelProto:
        """The model being built.

        Inside the ``with`` block this is the working model (:attr:`working_model`), whose
        large initializers are stubs. After the ``with`` block it is the finished,
        complete model (computed once).
        """
        if self._open:
            return self.working_model
        if self._finished_cache is None:
            self._finished_cache = self.materialize()
        return self._finished_cache

    @property
    def working_model(self) -> onnx.ModelProto:
        """The working model as a ``ModelProto`` (stubs in place of large initializers).

        One view of the build, open or closed: edits made to it reach the build, and the
        accessor's later writes show in it (see :mod:`onnxblocks.blocks.proto_view`).
        """
        return self._view.open(self.proto)  # proto() reads an edited view back first

    @property
    def path(self) -> str:
        """Path of the base model file.

        Raises:
            RuntimeError: if the build was opened without ``model_path``.
        """
        if self._path is None:
            raise StateError("This build has no model path: pass model_path= to onnxblocks.base().")
        return self._path

    @property
    def has_path(self) -> bool:
        """True when the build knows the base model's file path."""
        return self._path is not None

    @property
    def custom_op_libraries(self) -> tuple[str, ...]:
        """Custom op libraries registered with :func:`custom_op_library` for this build."""
        return _context.custom_op_libraries()

    def tensor(self, name: str) -> np.ndarray:
        """The data of an initializer as a numpy array, held or inline.

        Raises:
            UnknownNameError: if the model has no initializer ``name``.
        """
        if name in self.weights:
            return self.weights.source(name).array()
        self._sync()
        initializers = self._ir.graph.initializers
        value = initializers.get(name)
        if value is not None and value.const_value is not None:
            return value.const_value.numpy()
        raise UnknownNameError(
            f"The model has no initializer '{name}'.{did_you_mean(name, initializers)}"
        )

    def materialize(self, model: onnx.ModelProto | None = None) -> onnx.ModelProto:
        """A complete copy of ``model`` (default: the working model) with every stub replaced by
        its data.
        """
        if model is None:
            return self._fill_stubs(self.proto())
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return self._fill_stubs(out)

    def _fill_stubs(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """``model`` with each held stub replaced by its data, in place."""
        for init in model.graph.initializer:
            if _weights.is_stub(init) and init.name in self.weights:
                init.CopyFrom(self.weights.source(init.name).to_tensor_proto())
        return model

    def finish(self, materialize: bool = True) -> onnx.ModelProto:
        """Check the finished model once and return a copy ready to save or run.

        The check runs on a skeleton without weight bytes. The IR version is
        stamped so that the installed onnxruntime loads the model.

        Raises:
            ValueError: naming graph inputs or outputs whose rank is unknown.
            onnx.checker.ValidationError: if the model is invalid.
        """
        from onnxblocks.gradient.intake import check_ranks  # a lower layer, loaded on first use

        model = self.proto()  # a copy already: filled in place
        check_ranks(model, "the model")
        check_skeleton(model)
        return _limits.stamp_versions(self._fill_stubs(model) if materialize else model)

    def close(self) -> None:
        """Mark the build as ended (``.model`` then returns the complete model)."""
        self._open = False
