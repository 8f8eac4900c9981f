"""Gradient graphs: ONNX Runtime's native autodiff, wrapped.

:func:`build_training_graphs` turns a forward model whose first output is the
loss into the training model (with gradient accumulation) and the eval model
that ONNX Runtime's training API runs; :func:`build_vjp_graph` /
:func:`split_vjp_graph` make the vector-Jacobian graphs of :mod:`onnxblocks.torch`.
:func:`normalize` runs the normalisation passes (one module per family, listed
in :mod:`onnxblocks.gradient.rewrites`) that make exported models
differentiable by ONNX Runtime's builders; the passes themselves are not public
API. onnxruntime is imported only when a gradient is built.
"""

import onnxblocks.ir.lazy  # noqa: F401  # first: onnx-ir's sympy loads only if symbolic dims are computed with
from onnxblocks.gradient.accumulation import (
    LAZY_RESET_GRAD,
    accumulated_name,
    add_gradient_accumulation,
    buffer_name,
    gradient_name,
)
from onnxblocks.gradient.builder import TrainingGraphs, build_training_graphs, check_training_model
from onnxblocks.gradient.parameters import ParameterPartition, partition_parameters
from onnxblocks.gradient.rewrites import normalize
from onnxblocks.gradient.split import SplitVjp, split_vjp_graph
from onnxblocks.gradient.vjp import VjpGraph, build_vjp_graph

__all__ = [
    "LAZY_RESET_GRAD",
    "ParameterPartition",
    "SplitVjp",
    "TrainingGraphs",
    "VjpGraph",
    "accumulated_name",
    "add_gradient_accumulation",
    "buffer_name",
    "build_training_graphs",
    "build_vjp_graph",
    "check_training_model",
    "gradient_name",
    "normalize",
    "partition_parameters",
    "split_vjp_graph",
]
