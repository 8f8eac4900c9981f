"""The gradient-builder worker: run as a script by a Python 3.10-3.12 that has onnxruntime-training
1.19.2.

On a Python without the training build (3.13 and newer), onnxblocks builds
everything in-process and sends only ONNX Runtime's calls to this script
(:mod:`onnxblocks.gradient.worker` starts it): serialised skeleton graphs (held
weights are stubs or graph inputs) and names in, serialised graphs or ONNX
Runtime's error message out. No weights and no user Python code cross.

It imports nothing but the standard library and ``onnxruntime`` (the C bindings,
never ``onnxruntime.training``, which imports torch), so the worker environment
needs only ``onnxruntime-training-cpu``. It is run as a file with ``python -I``,
so it does not import onnxblocks either.

Protocol, on stdin/stdout: requests one after the other until stdin closes, each a
JSON header line followed by the bytes it announces (``sizes``), each answered the
same way. Tasks:

* ``probe``: ``{"python", "onnxruntime", "training_build"}``.
* ``gradient``: the model (bytes), ``requires_grad``, ``ys`` (the y nodes), ``seed``
  (the loss, or ``""``): ``get_optimized_model`` then ``GradientGraphBuilder``. The
  answer carries the built model, or ``error`` with ``stage`` and, after the
  optimizer ran, the optimized model (to explain the failure).
* ``load``: the model (bytes) loaded in an unoptimised CPU ``InferenceSession``;
  the answer carries ``error`` when it does not load.
* ``ort_format``: ``model_path`` converted to the ORT format at ``target`` (files on
  disk: the model's weights never go through the pipe).

Every task takes ``custom_op_libraries`` (paths).
"""

from __future__ import annotations

import json
import sys
from typing import Any, BinaryIO

_PROBE = "onnxruntime.training.ortmodule"


def _onnxruntime() -> Any:
    """``onnxruntime`` without its torch-importing probe (as :mod:`onnxblocks._core.ort` does)."""
    sys.modules[_PROBE] = None  # type: ignore[assignment]  # None makes the import fail
    try:
        import onnxruntime
    finally:
        sys.modules.pop(_PROBE, None)
    return onnxruntime


Answer = tuple[dict[str, Any], list[bytes]]


def _failed(stage: str, message: str, optimized: bytes = b"") -> Answer:
    return {"error": message, "stage": stage}, [optimized]


def _options(ort: Any, libraries: list[str], optimize: bool = True) -> tuple[Any, Answer | None]:
    """Session options that log errors only, with the custom op libraries; or the failure to load
    one.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for library in libraries:
        try:
            options.register_custom_ops_library(library)
        except Exception as exc:
            return None, _failed("library", f"{library}\n{exc}")
    return options, None


def _gradient(ort: Any, header: dict[str, Any], model: bytes) -> Answer:
    from onnxruntime.capi import _pybind_state as capi

    options, failed = _options(ort, header["custom_op_libraries"])
    if failed:
        return failed
    wanted = set(header["requires_grad"])
    try:
        optimized: bytes = capi.get_optimized_model(model, wanted, options)
    except Exception as exc:
        return _failed("optimize", str(exc))
    try:
        builder = capi.GradientGraphBuilder(
            optimized, set(header["ys"]), wanted, header["seed"], options
        )
        builder.build()
        result: bytes = builder.get_model()
    except Exception as exc:
        return _failed("build", str(exc), optimized)
    return {}, [result]


def _load(ort: Any, header: dict[str, Any], model: bytes) -> Answer:
    options, failed = _options(ort, header["custom_op_libraries"], optimize=False)
    if failed:
        return failed
    try:
        ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return _failed("load", str(exc))
    return {}, []


def _ort_format(ort: Any, header: dict[str, Any]) -> Answer:
    options, failed = _options(ort, header["custom_op_libraries"])
    if failed:
        return failed
    options.optimized_model_filepath = header["target"]
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.save_model_format", "ORT")
    try:
        ort.InferenceSession(
            header["model_path"],
            sess_options=options,
            providers=["CPUExecutionProvider"],
            disabled_optimizers=["NchwcTransformer"],
        )
    except Exception as exc:
        return _failed("ort_format", str(exc))
    return {}, []


def _answer(out: BinaryIO, header: dict[str, Any], blobs: list[bytes]) -> None:
    header["sizes"] = [len(b) for b in blobs]
    out.write(json.dumps(header).encode() + b"\n")
    for blob in blobs:
        out.write(blob)
    out.flush()


def main() -> int:
    """Answer requests from stdin on stdout until stdin closes (an ONNX Runtime error is an
    answer, not a crash).
    """
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    ort = _onnxruntime()
    from onnxruntime.capi import _pybind_state as capi

    while True:
        line = stdin.readline()
        if not line.strip():
            return 0
        header = json.loads(line)
        payload = [stdin.read(size) for size in header.get("sizes", [])]
        if [len(p) for p in payload] != header.get("sizes", []):
            return 1  # the caller went away mid-request
        task = header["task"]
        answer: Answer
        if task == "probe":
            training = all(
                hasattr(capi, n)
                for n in ("GradientGraphBuilder", "Module", "Optimizer", "load_checkpoint")
            )
            info = {
                "python": list(sys.version_info[:3]),
                "onnxruntime": ort.__version__,
                "training_build": training,
            }
            answer = info, []
        elif task == "gradient":
            answer = _gradient(ort, header, payload[0])
        elif task == "load":
            answer = _load(ort, header, payload[0])
        elif task == "ort_format":
            answer = _ort_format(ort, header)
        else:
            answer = _failed("protocol", f"unknown task {task!r}")
        _answer(stdout, *answer)


if __name__ == "__main__":
    sys.exit(main())
