"""Exporting a torch module for one input signature, and the map from its graph back to the module.

:func:`export_module` wraps the module in a small holder whose ``forward``
takes the tensor leaves of ``(args, kwargs)`` by position and returns the tensor
leaves of the module's output: both exporters then see plain tensors in and out,
whatever keywords and nesting the module uses (non-tensor arguments are baked into
the graph and are part of the signature). It exports with

* ``"dynamo"`` (default): ``torch.onnx.export(..., dynamo=True, optimize=False)``
  with the first dim of every tensor ``Dim.AUTO`` (``dynamic="batch"``; ``"all"``
  for every dim, ``"none"`` for static shapes): torch.export keeps such a dim
  symbolic unless the code fixes it, so one export serves every batch size the code
  allows. Other dims are static: ONNX Runtime's pooling gradients need static
  spatial sizes;
* ``"torchscript"``: ``torch.onnx.export(..., dynamo=False, do_constant_folding=False)``
  in ``TrainingMode.PRESERVE`` with static shapes (a trace bakes shapes in). The
  holder is in training mode so that torch does not merge initializers that happen
  to hold equal values (it does so for eval-mode exports, and their gradients would mix).

The module's state is untouched: buffers and the RNG state are restored after
the export and after the eager run that records the output structure.

Then the graph is fitted to the module's mode (:func:`fit_batch_norms`): in
training mode every BatchNormalization uses batch statistics and exposes its input
so the running statistics can be updated in torch, exactly as torch does; in eval
mode every BatchNormalization uses the running statistics (:mod:`onnxblocks.torch.batch_norm`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, cast

import onnx
import onnx_ir as ir
import torch
from torch.utils import _pytree as pytree

from onnxblocks._core.errors import InvalidValueError, StateError, TorchExportError
from onnxblocks.ir import serde
from onnxblocks.ir.edit import rename_values
from onnxblocks.ir.names import graph_names
from onnxblocks.torch._outputs import CONSTANT_TYPES, OutputSlot, output_plan, register_dataclasses
from onnxblocks.torch.batch_norm import fit_batch_norms
from onnxblocks.torch.exported import BatchNormUpdate, Exported
from onnxblocks.torch.torchlib import shared_registry

__all__ = [
    "BatchNormUpdate",
    "ExportError",
    "Exported",
    "OutputSlot",
    "export_module",
    "fit_batch_norms",
    "register_dataclasses",
]

EXPORTERS = ("dynamo", "torchscript")
DYNAMIC = ("batch", "all", "none")
_PREFIX = "module."


#: The exporter's failure (the name torch users know; one class with
#: :class:`onnxblocks.errors.TorchExportError`).
ExportError = TorchExportError


#: Marks a tensor leaf among the holder's constants (None is a constant argument like any other).
_TENSOR = object()


class _Holder(torch.nn.Module):
    """Calls a module on ``(args, kwargs)`` rebuilt from tensor leaves; returns its output's
    tensor leaves.
    """

    def __init__(self, module: torch.nn.Module, in_spec: Any, leaves: Sequence[Any]) -> None:
        super().__init__()
        self.module = module
        self.in_spec = in_spec
        self.constants = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        #: The output leaves that become graph outputs, by position (from the eager run: a trace
        #: turns sizes
        #: into tensors too, and loses which tensors are the same object).
        self.graph_outputs: list[int] | None = None

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = iter(tensors)
        leaves = [next(feed) if c is _TENSOR else c for c in self.constants]
        args, kwargs = pytree.tree_unflatten(leaves, self.in_spec)
        flat, _ = pytree.tree_flatten(self.module(*args, **kwargs))
        if self.graph_outputs is None:
            return tuple(leaf for leaf in flat if isinstance(leaf, torch.Tensor))
        return tuple(flat[i] for i in self.graph_outputs)


def export_module(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exporter: str,
    opset: int | None = None,
    dynamic: str = "batch",
) -> Exported:
    """Export ``module`` for the signature of ``(args, kwargs)`` in its current mode.

    Raises:
        ValueError: for an unknown exporter or ``dynamic`` policy.
        ExportError: when the module does not run on these inputs, or torch cannot export it.
    """
    if exporter not in EXPORTERS:
        raise InvalidValueError(f"exporter must be one of {EXPORTERS}, not {exporter!r}.")
    if dynamic not in DYNAMIC:
        raise InvalidValueError(f"dynamic must be one of {DYNAMIC}, not {dynamic!r}.")
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    holder = _Holder(module, in_spec, leaves)
    label = type(module).__name__
    with _preserved(module):
        try:
            with torch.no_grad():
                out = module(*args, **kwargs)
        except Exception as exc:
            raise ExportError(
                f"{label} fails on these inputs in torch itself: {type(exc).__name__}: {exc}"
            ) from exc
        register_dataclasses(out)
        out_leaves, out_spec = pytree.tree_flatten(out)
        odd = next(
            (leaf for leaf in out_leaves if not isinstance(leaf, (torch.Tensor, *CONSTANT_TYPES))),
            None,
        )
        if odd is not None:
            raise ExportError(
                f"{label} returns a {type(odd).__name__}, which OrtModule cannot rebuild around "
                "ONNX Runtime's "
                "outputs: return tensors in tuples, lists, dicts, namedtuples, dataclasses or "
                "ModelOutputs."
            )
        plan, holder.graph_outputs = output_plan(out_leaves, tensors)
        names = [f"input_{k}" for k in range(len(tensors))]
        if not holder.graph_outputs:  # nothing computed: the module's own call returns it
            return Exported(onnx.ModelProto(), (), (), (), (), out_spec, plan, graphless=True)
        try:  # detached: an input that already holds a .grad trips the exporter
            exported = _export(
                holder, tuple(t.detach() for t in tensors), names, exporter, opset, dynamic
            )
        except Exception as exc:
            raise ExportError(_export_failure(label, exporter, exc)) from exc
        _strip_prefix(exported)
        model = serde.to_proto(exported)  # the module's tensors as they were exported
    if len(model.graph.output) != len(holder.graph_outputs):
        raise ExportError(
            f"{label}'s export has {len(model.graph.output)} graph outputs for "
            f"{len(holder.graph_outputs)} tensor "
            "outputs; "
            "return tensors (in tuples, lists or dicts) from forward."
        )
    inputs = tuple(vi.name for vi in model.graph.input if vi.name in set(names))
    tensors_by_name = _module_tensors(module)
    weights: list[str] = []
    baked: list[tuple[torch.Tensor, int]] = []
    for init in model.graph.initializer:
        tensor = tensors_by_name.get(init.name)
        if tensor is None:
            continue
        if isinstance(tensor, torch.nn.Parameter) or tensor.is_floating_point():
            weights.append(init.name)
        else:
            baked.append((tensor, tensor._version))
    return Exported(
        model=model,
        inputs=inputs,
        input_leaves=tuple(names.index(n) for n in inputs),
        weights=tuple(weights),
        outputs=tuple(o.name for o in model.graph.output),
        out_spec=out_spec,
        out_leaves=plan,
        baked=baked,
    )


def _export(
    holder: _Holder,
    tensors: tuple[torch.Tensor, ...],
    names: list[str],
    exporter: str,
    opset: int | None,
    dynamic: str,
) -> ir.Model:
    with _quiet():
        if exporter == "dynamo":
            count = {"batch": 1, "all": None, "none": 0}[dynamic]
            dims = tuple(
                {
                    i: torch.export.Dim.AUTO
                    for i in range(t.dim() if count is None else min(count, t.dim()))
                }
                for t in tensors
            )
            with shared_registry():
                program = torch.onnx.export(
                    holder,
                    tensors,
                    dynamo=True,
                    optimize=False,
                    input_names=names,
                    dynamic_shapes=(dims,),
                    opset_version=opset,
                )
            if (
                program is None
            ):  # pragma: no cover - torch returns the program when no file is given
                raise StateError("torch.onnx.export returned no program")
            return program.model  # torch's exporter builds the same onnx-ir model
        buffer = io.BytesIO()
        mode = holder.training
        holder.training = True  # not train(): the module's own mode is what gets exported
        try:
            torch.onnx.export(
                holder,
                tensors,
                cast(
                    Any, buffer
                ),  # TorchScript writes to a file object too; the annotation says paths
                dynamo=False,
                input_names=names,
                do_constant_folding=False,
                training=torch.onnx.TrainingMode.PRESERVE,
                opset_version=opset or 17,
            )
        finally:
            holder.training = mode
        return serde.from_proto(onnx.load_from_string(buffer.getvalue()))


def _export_failure(label: str, exporter: str, exc: BaseException) -> str:
    text = str(exc).strip()
    summary = text
    marker = "## Exception summary"
    if marker in text:
        summary = text.split(marker, 1)[1].strip().split("\n\n", 1)[0]
    lines = [line for line in summary.splitlines() if line.strip()][:6]
    how = "dynamo=True" if exporter == "dynamo" else "dynamo=False (TorchScript)"
    other = "torchscript" if exporter == "dynamo" else "dynamo"
    return (
        f"torch.onnx.export({how}) could not export {label}: {type(exc).__name__}: "
        + "\n".join(lines)
        + "\n"
        f"Try exporter='{other}', rewrite the part of {label} named above, or pass fallback=True "
        "to run "
        "such inputs eagerly in torch."
    )


def _strip_prefix(model: ir.Model) -> None:
    """Rename ``module.<name>`` initializers (the holder's child) to the module's own names, in
    place.

    A name the graph already uses elsewhere keeps its prefix.
    """
    graph = model.graph
    renamed = {
        name: name[len(_PREFIX) :] for name in graph.initializers if name.startswith(_PREFIX)
    }
    if not renamed:
        return
    taken = graph_names(graph)
    rename_values(graph, {old: new for old, new in renamed.items() if not taken.is_used(new)})


def _module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = dict(module.named_buffers(remove_duplicate=False))
    found.update(module.named_parameters(remove_duplicate=False))
    return found


@contextlib.contextmanager
def _preserved(module: torch.nn.Module) -> Iterator[None]:
    """Restore the module's buffers, modes and torch's RNG state afterwards (exporters run the
    module).
    """
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    modes = [(m, m.training) for m in module.modules()]
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in buffers:
                if buffer.shape == value.shape:
                    buffer.copy_(value)
        for m, mode in modes:
            m.training = mode
        torch.set_rng_state(rng)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' progress lines and warnings."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with (
        warnings.catch_warnings(),
        open(os.devnull, "w") as devnull,
        contextlib.redirect_stdout(devnull),
        contextlib.redirect_stderr(devnull),
    ):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)
