"""An exported graph's BatchNormalization nodes fitted to the torch module's mode.

In training mode every BatchNormalization uses batch statistics and exposes its input so that the
running statistics can be updated in torch, exactly as torch does; in eval mode every
BatchNormalization uses the running statistics. :func:`update_running_stats` is the torch side of
training mode: the running statistics updated from the batch the graph normalised.
"""

from __future__ import annotations

import onnx
import torch

from onnxblocks.ir.names import proto_graph_names
from onnxblocks.ir.proto import set_attribute
from onnxblocks.torch.exported import BatchNormUpdate, Exported


def fit_batch_norms(exported: Exported, module: torch.nn.Module, training: bool) -> list[str]:
    """Put every BatchNormalization of ``exported.model`` in the module's mode, in place.

    Training mode: ``training_mode=1`` (torch's dynamo exporter writes 0 for a
    training-mode BatchNorm) and, for a BatchNorm module that tracks running
    statistics, its input becomes a graph output so the wrapper updates them in torch.
    Eval mode: ``training_mode=0`` and the running-statistics outputs dropped.

    Returns:
        The graph outputs added (they take no gradient).
    """
    graph = exported.model.graph
    outputs = {o.name for o in graph.output}
    inputs = {vi.name for vi in graph.input}
    added: list[str] = []
    names = proto_graph_names(graph)
    for node in graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        set_attribute(node, "training_mode", 1 if training else 0)
        if not training:
            del node.output[1:]
            continue
        while (
            len(node.output) < 3
        ):  # ONNX: three outputs in training mode (ONNX Runtime's values are unused)
            node.output.append(
                names.fresh(
                    f"{node.output[0]}.running_{'mean' if len(node.output) == 1 else 'var'}"
                )
            )
        path = node.input[3].rpartition(".")[0] if len(node.input) > 3 else ""
        owner = _submodule(module, path)
        if (
            not isinstance(owner, torch.nn.modules.batchnorm._BatchNorm)
            or not owner.track_running_stats
        ):
            continue
        value = node.input[0]
        if value not in outputs and value not in inputs:
            graph.output.append(onnx.helper.make_empty_tensor_value_info(value))
            outputs.add(value)
            added.append(value)
        exported.batch_norms.append(BatchNormUpdate(path, value))
    return added


def _submodule(module: torch.nn.Module, path: str) -> torch.nn.Module | None:
    try:
        return module.get_submodule(path) if path else None
    except AttributeError:
        return None


def update_running_stats(modules: list[torch.nn.Module], inputs: list[torch.Tensor]) -> None:
    """BatchNorm's training-mode update of its running statistics from the normalised batch, by
    torch itself.

    ``torch.nn.functional.batch_norm`` in training mode updates the running mean and
    (unbiased) variance in place with torch's own formula; its normalised output is
    dropped (computing it costs less than a separate ``var_mean`` over the batch).
    """
    with torch.no_grad():
        for bn, x in zip(modules, inputs, strict=True):
            tracked = bn.num_batches_tracked
            if isinstance(tracked, torch.Tensor):
                tracked.add_(1)
            momentum = bn.momentum
            if momentum is None:  # a cumulative average
                factor = 1.0 / float(tracked) if isinstance(tracked, torch.Tensor) else 0.0
            else:
                factor = float(momentum)  # type: ignore[arg-type]  # nn.Module attributes type as Tensor | Module
            running_mean, running_var = bn.running_mean, bn.running_var
            if isinstance(running_mean, torch.Tensor) and isinstance(running_var, torch.Tensor):
                torch.nn.functional.batch_norm(
                    x,
                    running_mean,
                    running_var,
                    training=True,
                    momentum=factor,
                    eps=float(bn.eps),  # type: ignore[arg-type]  # as above
                )
