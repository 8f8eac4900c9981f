"""One IR pass as a ``ModelProto -> int`` function, for tests that check a pass on a protobuf model.

The library runs its passes on one ``ir.Model`` (``normalize`` converts once each way);
tests written against a single pass on a ``ModelProto`` use :func:`on_proto`.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from onnxblocks.ir.passes import Pass
from onnxblocks.ir.rewrite import changed, may_apply, run_pass
from onnxblocks.ir.serde import from_proto, to_proto


def on_proto(
    pass_factory: Callable[[], Pass],
    name: str | None = None,
    doc: str | None = None,
) -> Callable[[onnx.ModelProto], int]:
    """``pass_factory()``'s pass as a function that edits a ModelProto in place and returns its
    number of changes (the model is rewritten only when something changed).
    """

    def run(model: onnx.ModelProto) -> int:
        pass_ = pass_factory()
        if not may_apply([pass_], model):
            return 0
        ir_model = from_proto(model)
        count = changed(run_pass(pass_, ir_model))
        if count:
            model.CopyFrom(to_proto(ir_model))
        return count

    run.__name__ = run.__qualname__ = name or getattr(pass_factory, "name", "") or "run"
    run.__doc__ = doc
    return run
