"""The legacy ``GradientGraphBuilder``: a model's forward graph plus the gradients of its loss, on
the normalised path.

ONNX Runtime's pre-1.15 ``GradientGraphBuilder(model_bytes, y_node_arg_names,
x_node_arg_names, loss_node_arg_name)`` wrote the forward graph with the
gradient of the loss with respect to each ``x`` as the output ``<x>_grad``. Here
the graph comes from :func:`onnxblocks.gradient.build_vjp_graph` (opset upgrade,
the normalisation passes, ONNX Runtime's builder), with the loss's incoming
gradient set to one and the weights kept as initializers, so the result runs as
is on any onnxruntime.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx

from onnxblocks._core.contracts import gradient_name
from onnxblocks._core.errors import InvalidTypeError, StateError, UnknownNameError, did_you_mean


def _names(value: Iterable[str] | str, parameter: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidTypeError(
            f"{parameter} must be a collection of names, not {type(value).__name__} {value!r:.40}."
        )
    names = list(dict.fromkeys(value))
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise InvalidTypeError(f"{parameter} holds {bad[0]!r:.40}, which is not a name (str).")
    return sorted(names)


class GradientGraphBuilder:
    """Build the gradient graph of a loss (legacy ``onnxruntime.training.GradientGraphBuilder``).

    Args:
        model_bytes: The forward model: serialized bytes, a ``ModelProto`` or a path.
        y_node_arg_names: Outputs the gradient model keeps (the loss is added when missing).
        x_node_arg_names: Weights (initializers) and graph inputs whose gradient is output as
        ``<x>_grad``.
        loss_node_arg_name: The scalar loss the gradients are taken of.
        gradient_graph_config: Accepted for compatibility and unused: onnxblocks' normalisation
            and ONNX Runtime's default builder settings apply.

    Raises:
        UnknownNameError: for a loss, y or x name the model does not have.
    """

    def __init__(
        self,
        model_bytes: bytes | onnx.ModelProto | str | os.PathLike,
        y_node_arg_names: Iterable[str],
        x_node_arg_names: Iterable[str],
        loss_node_arg_name: str,
        gradient_graph_config: Any = None,
    ) -> None:
        if isinstance(model_bytes, onnx.ModelProto):
            self._forward = onnx.ModelProto()
            self._forward.CopyFrom(model_bytes)
        else:
            from onnxblocks.compat._legacy_parameters import load_model_arg

            self._forward = load_model_arg(model_bytes)[0]
        outputs = [o.name for o in self._forward.graph.output]
        if not isinstance(loss_node_arg_name, str) or loss_node_arg_name not in outputs:
            raise UnknownNameError(
                f"loss_node_arg_name '{loss_node_arg_name}' is not an output of the model."
                f"{did_you_mean(str(loss_node_arg_name), outputs)} Outputs: {outputs}."
            )
        ys = _names(y_node_arg_names, "y_node_arg_names")
        for name in ys:
            if name not in outputs:
                raise UnknownNameError(
                    f"y_node_arg_names names '{name}', which is not an "
                    f"output.{did_you_mean(name, outputs)}"
                )
        self.loss = loss_node_arg_name
        self.ys = [loss_node_arg_name, *(y for y in ys if y != loss_node_arg_name)]
        self.xs = _names(x_node_arg_names, "x_node_arg_names")
        self._model: onnx.ModelProto | None = None

    def build(self) -> None:
        """Build the gradient graph (ONNX Runtime's builder; in a worker Python where onnxruntime
        is stock).
        """
        import onnx_ir as ir

        from onnxblocks.gradient import build_vjp_graph
        from onnxblocks.ir import serde

        vjp = build_vjp_graph(self._forward, self.xs, outputs=self.ys, no_grad_outputs=self.ys[1:])
        model = serde.from_proto(vjp.model)
        graph = model.graph
        values = {
            init.name: onnx.numpy_helper.to_array(init) for init in self._forward.graph.initializer
        }
        constants: dict[str, np.ndarray] = {}
        for name in (*vjp.partition.trainable, *vjp.partition.frozen):
            if name in values:
                constants[name] = values[name]
        for name in vjp.output_grads:  # the loss's incoming gradient: d loss / d loss = 1
            shape = [d if isinstance(d, int) else 1 for d in (graph.outputs[0].shape or ())]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(self._elem_type(self.loss))
            constants[name] = np.ones(shape, dtype)
        for value in list(graph.inputs):
            if value.name in constants:
                graph.inputs.remove(value)
                value.const_value = ir.tensor(constants[value.name], name=value.name)
                graph.register_initializer(value)
        self._model = serde.to_proto(model)
        self.gradients = [gradient_name(x) for x in self.xs if x in vjp.gradients]

    def _elem_type(self, name: str) -> int:
        for info in (*self._forward.graph.output, *self._forward.graph.value_info):
            if info.name == name and info.type.tensor_type.elem_type:
                return int(info.type.tensor_type.elem_type)
        return onnx.TensorProto.FLOAT

    def get_model(self) -> bytes:
        """The gradient model, serialized: inputs of the forward model, outputs ``y...`` then
        ``<x>_grad...``.

        Raises:
            StateError: before :meth:`build`.
        """
        if self._model is None:
            raise StateError("GradientGraphBuilder.get_model: call build() first.")
        return self._model.SerializeToString()

    def save(self, path: str | os.PathLike) -> None:
        """Write the gradient model to ``path`` (atomically).

        Raises:
            StateError: before :meth:`build`.
        """
        from onnxblocks._core.paths import as_path
        from onnxblocks.io import save_model

        if self._model is None:
            raise StateError("GradientGraphBuilder.save: call build() first.")
        save_model(self._model, as_path(path, "path"))
