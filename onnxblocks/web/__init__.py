"""Training in JavaScript: the bridge between onnxblocks and the web/Node client in ``js/``
(docs/web.md).

* :mod:`~onnxblocks.web.state`: ``params.safetensors``, the state file both sides read and write
  (:func:`write_state` from a checkpoint, :func:`read_state`, :func:`state_to_checkpoint`,
  :func:`load_state` into a ``TrainingSession``);
* :mod:`~onnxblocks.web.flat_step`: ``flat_step_model.onnx``, the step model with one flat state
  tensor each way (:func:`write_flat_step`), the client's fast path on WASM and Node's CPU;
* :mod:`~onnxblocks.web.safetensors`: the file format, in numpy;
* :mod:`~onnxblocks.web.site`: the browser demo (``onnxblocks demo --web``),
  :mod:`~onnxblocks.web.server`
  serves it on 127.0.0.1;
* :mod:`~onnxblocks.web.inference`: the trained inference model as ``.onnx`` from JavaScript
  (:func:`write_inference_template`: the model and where its weights lie, filled by the client);
* :mod:`~onnxblocks.web.npm`: the client's npm packages, installed once into a cache.
"""

from onnxblocks.web.flat_step import write_flat_step
from onnxblocks.web.inference import write_inference_template
from onnxblocks.web.npm import NpmError, install_js_dependencies
from onnxblocks.web.safetensors import read_safetensors, write_safetensors
from onnxblocks.web.server import serve, serving
from onnxblocks.web.site import SpiralPlan, build_site, spiral_artifacts, spiral_plan
from onnxblocks.web.state import WebState, load_state, read_state, state_to_checkpoint, write_state

__all__ = [
    "NpmError",
    "SpiralPlan",
    "WebState",
    "build_site",
    "install_js_dependencies",
    "load_state",
    "read_safetensors",
    "read_state",
    "serve",
    "serving",
    "spiral_artifacts",
    "spiral_plan",
    "state_to_checkpoint",
    "write_flat_step",
    "write_inference_template",
    "write_safetensors",
    "write_state",
]
