"""Torch interop: ONNX graphs as autograd Functions, and torch modules trained through ONNX Runtime.

* :func:`onnx_function` / :class:`OnnxModule`: an ONNX graph whose forward and
  backward run in ONNX Runtime, as a ``torch.autograd.Function`` or an
  ``nn.Module`` holding its trainable initializers (the role of deeponnxcustom's
  ``TorchOrtFactory``).
* :class:`OrtModule`: a ``torch.nn.Module`` exported with torch's exporter and
  trained through ONNX Runtime, its parameters and buffers still its own (the role
  of ``onnxruntime.training.ORTModule``).

torch is an optional dependency: ``pip install "onnxblocks[torch]"``. This is the
only package of onnxblocks that imports it.
"""

from onnxblocks._core.errors import MissingDependencyError, OrtRunError

try:
    import torch as _torch  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised in a venv without torch
    raise MissingDependencyError(
        "onnxblocks.torch needs PyTorch, which is not installed. Install it with: pip install "
        '"onnxblocks[torch]"'
    ) from _exc

from onnxblocks.torch.export import ExportError
from onnxblocks.torch.function import OnnxFunction, OnnxModule, onnx_function
from onnxblocks.torch.module import OrtModule

__all__ = ["ExportError", "OnnxFunction", "OnnxModule", "OrtModule", "OrtRunError", "onnx_function"]
