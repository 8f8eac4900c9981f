"""A torch module trained through ONNX Runtime (the role of
``onnxruntime.training.ORTModule``).

``OrtModule(module)`` exports ``module`` with torch's exporter on the first call
(:mod:`onnxblocks.torch.export`), builds its forward and backward graphs with
onnxblocks (:mod:`onnxblocks.torch.function`) and runs both in ONNX Runtime.

* The parameters and buffers stay the module's own: they are fed to ONNX Runtime
  on every call, without copies. ``named_parameters``, ``parameters``,
  ``state_dict`` and ``load_state_dict`` are the module's (no ``module.``
  prefix), so an optimizer built on either trains the same tensors.
* ``train()`` / ``eval()`` switch Dropout and BatchNorm: the module is exported once
  per mode. In training mode BatchNorm's running statistics (and
  ``num_batches_tracked``) are updated in torch after each forward, as torch does.
* A call whose signature differs (training mode, tensor dtypes and ranks,
  non-tensor arguments, the structure of ``args`` / ``kwargs``, or a size the
  export fixed) exports again; each export is cached. Integer and bool buffers
  (masks, positions) are baked into the graph; changing one in place re-exports.
* On a module or input the exporter or ONNX Runtime cannot handle it raises an
  error naming the module and what failed, unless ``fallback=True``: then it warns
  once per signature and runs those calls eagerly in torch.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from onnxblocks._core.errors import GradientError, InvalidTypeError, InvalidValueError
from onnxblocks.gradient import SplitVjp
from onnxblocks.torch.batch_norm import update_running_stats
from onnxblocks.torch.cached_export import (
    CachedExport,
    call_constants,
    module_tensor,
    module_weights,
    tensor_owner,
)
from onnxblocks.torch.embedding import fit_embeddings_proto
from onnxblocks.torch.export import (
    DYNAMIC,
    EXPORTERS,
    Exported,
    ExportError,
    OutputSlot,
    export_module,
    fit_batch_norms,
    register_dataclasses,
)
from onnxblocks.torch.function import onnx_function

__all__ = ["OrtModule"]


class OrtModule(torch.nn.Module):
    """Train a torch module through ONNX Runtime: forward and backward run as ONNX graphs.

    Args:
        module: The module to wrap (its parameters and buffers stay its own).
        exporter: ``"dynamo"`` (``torch.onnx.export(dynamo=True, optimize=False)``) or
            ``"torchscript"`` (``dynamo=False``, static shapes).
        dynamic: With dynamo, the dims left symbolic where the code allows: ``"batch"``
            (the first dim of each tensor input), ``"all"`` or ``"none"``.
        fallback: Run a signature the exporter or ONNX Runtime cannot handle eagerly in
            torch, with a warning, instead of raising.
        opset: The ai.onnx opset to export with (the exporter's default when None).
        custom_op_libraries: Shared libraries with custom ops, registered with ONNX Runtime.
        threads: ONNX Runtime's intra-op threads (0: its default, one per physical core).

    Raises:
        TypeError: when ``module`` is not a torch module.
        ValueError: for an unknown exporter.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        exporter: str = "dynamo",
        dynamic: str = "batch",
        fallback: bool = False,
        opset: int | None = None,
        custom_op_libraries: Sequence[str] = (),
        threads: int = 0,
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise InvalidTypeError(
                f"OrtModule wraps a torch.nn.Module, not {type(module).__name__}."
            )
        if exporter not in EXPORTERS:
            raise InvalidValueError(f"exporter must be one of {EXPORTERS}, not {exporter!r}.")
        if dynamic not in DYNAMIC:
            raise InvalidValueError(f"dynamic must be one of {DYNAMIC}, not {dynamic!r}.")
        super().__init__()
        self.module = module
        self.exporter = exporter
        self.dynamic = dynamic
        self.fallback = fallback
        self.opset = opset
        self.custom_op_libraries = tuple(custom_op_libraries)
        self.threads = threads
        self._cache: dict[Hashable, list[CachedExport]] = {}
        self._last: CachedExport | None = None
        self.forward = _Forward(self)  # carries the module's own signature

    # ---------------------------------------------------------------- the module's own state
    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.module.named_buffers(prefix, recurse, remove_duplicate)
        for name, buffer in self._buffers.items():  # registered on the wrapper itself
            if buffer is not None:
                yield (f"{prefix}.{name}" if prefix else name), buffer

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)

    @property
    def onnx_model(self) -> Any:
        """The ONNX model of the latest export (None before the first call)."""
        return (
            None if self._last is None or self._last.exported is None else self._last.exported.model
        )

    @property
    def gradient_graphs(self) -> SplitVjp | None:
        """The forward and backward halves ONNX Runtime ran for the latest export (None before a
        training call).

        ``forward`` computes the outputs and the values saved for the backward
        (``saved``); ``backward`` computes the gradients from them and the output gradients.
        """
        if self._last is None or self._last.function is None:
            return None
        latest = self._last.function.program.latest
        return None if latest is None else latest.split

    @property
    def exports(self) -> int:
        """How many exports are cached (eager signatures not counted)."""
        return sum(1 for entries in self._cache.values() for e in entries if e.exported is not None)

    # ---------------------------------------------------------------- calls
    def _call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module's forward through ONNX Runtime (or eagerly for a fallback signature)."""
        spec: Hashable
        if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
            register_dataclasses((args, kwargs))
            leaves, spec = pytree.tree_flatten((args, kwargs))
        else:  # the common case, without pytree's cost
            leaves, spec = list(args), len(args)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        key = (
            self.module.training,
            spec,
            call_constants(leaves),
            tuple((t.dtype, t.dim()) for t in tensors),
        )
        entry, weights = self._find(key, tensors)
        if entry is None:
            entry = self._build(args, kwargs, tensors)
            self._cache.setdefault(key, []).append(entry)
            weights = module_weights(entry)
        self._last = entry
        if (
            entry.exported is None or entry.function is None
        ):  # eager: a fallback, or nothing to compute
            return self.module(*args, **kwargs)
        exported = entry.exported
        inputs = [tensors[i] for i in exported.input_leaves]
        result = entry.function.apply_checked(
            [*inputs, *weights]
        )  # _find checked them against the export
        outputs = list(result) if isinstance(result, tuple) else [result]
        count = len(exported.outputs)
        if entry.batch_norms and self.module.training:
            batches = [
                (inputs if is_input else outputs)[index] for _, is_input, index in entry.batch_norms
            ]
            update_running_stats([bn for bn, _, _ in entry.batch_norms], batches)
        if entry.single_output:
            return outputs[0]
        leaves_out = [
            (
                (outputs[:count] if leaf.graph else tensors)[leaf.index]
                if isinstance(leaf, OutputSlot)
                else leaf
            )
            for leaf in exported.out_leaves
        ]
        return pytree.tree_unflatten(leaves_out, exported.out_spec)

    def _find(
        self, key: Hashable, tensors: list[torch.Tensor]
    ) -> tuple[CachedExport | None, list[torch.Tensor]]:
        """The cached export for this call, and the module's tensors it reads (checked against
        the export).
        """
        for entry in self._cache.get(key, []):
            exported = entry.exported
            if exported is None:
                return entry, []
            if any(t._version != version for t, version in exported.baked):
                continue
            weights = module_weights(entry)
            if any(
                w.dtype != d or w.device.type != "cpu"
                for w, d in zip(weights, entry.dtypes, strict=True)
            ):
                continue
            if all(
                dims is None
                or (
                    len(dims) == t.dim()
                    and all(d is None or d == s for d, s in zip(dims, t.shape, strict=True))
                )
                for dims, t in zip(
                    entry.dims, (tensors[i] for i in exported.input_leaves), strict=True
                )
            ) and all(tensors[i].device.type == "cpu" for i in exported.input_leaves):
                return entry, weights
        return None, []

    def _export(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Exported:
        """Export for this call; a dynamo export that fails with symbolic dims is retried with
        static shapes.

        (A size that becomes symbolic can reach where the exporter needs a constant: an
        ``ignore_index``
        computed from ``x.size(1)``.)
        """
        try:
            return export_module(self.module, args, kwargs, self.exporter, self.opset, self.dynamic)
        except ExportError as exc:
            if (
                self.exporter != "dynamo"
                or self.dynamic == "none"
                or "fails on these inputs in torch" in str(exc)
            ):
                raise
            return _static_retry(
                exc, lambda: export_module(self.module, args, kwargs, "dynamo", self.opset, "none")
            )

    def _build(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], tensors: list[torch.Tensor]
    ) -> CachedExport:
        label = type(self.module).__name__
        training = self.module.training
        try:
            exported = self._export(args, kwargs)
            if exported.graphless:
                return CachedExport(None)
            weight_names = list(exported.weights)
            exported.model, frozen = fit_embeddings_proto(exported.model, self.module, weight_names)
            exported.weights = tuple(weight_names)
            statistics = fit_batch_norms(exported, self.module, training)
            function = onnx_function(
                exported.model,
                exported.weights,
                inputs=exported.inputs,
                outputs=[*exported.outputs, *statistics],
                no_grad_outputs=statistics,
                custom_op_libraries=self.custom_op_libraries,
                threads=self.threads,
                check=False,
            )
            trained = dict(self.module.named_parameters())
            wanted = frozenset(
                n for n in exported.weights if n in trained and trained[n].requires_grad
            )
            if (
                wanted and torch.is_grad_enabled()
            ):  # build the backward now: a failure names the node here
                function.program.compiled(wanted)
        except InvalidValueError as exc:
            raise InvalidValueError(f"OrtModule({label}): {exc}") from exc
        except (ExportError, GradientError) as exc:
            if not self.fallback:
                if isinstance(exc, GradientError):
                    raise GradientError(f"Training {label} through ONNX Runtime: {exc}") from exc
                raise
            warnings.warn(
                f"OrtModule({label}): running these inputs ({'training' if training else 'eval'} "
                "mode) eagerly in "
                f"torch, not in ONNX Runtime, because: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )
            return CachedExport(None)
        owners = [
            tensor_owner(self.module, frozen[n].source if n in frozen else n)
            for n in exported.weights
        ]
        program = function.program
        extra = {name: len(exported.outputs) + i for i, name in enumerate(statistics)}
        positions = {name: i for i, name in enumerate(exported.inputs)}
        batch_norms = [
            (
                self.module.get_submodule(b.path),
                b.value in positions,
                positions.get(b.value, extra.get(b.value, -1)),
            )
            for b in exported.batch_norms
        ]
        dims: list[list[int | None] | None] = [
            dims for _, dims in program.signature[: len(exported.inputs)]
        ]
        if any(
            not isinstance(leaf, (OutputSlot, str, bool, type(None)))
            for leaf in exported.out_leaves
        ):
            # a non-tensor output (a size) is the eager run's value: valid for these exact shapes
            # only
            dims = [list(tensors[i].shape) for i in exported.input_leaves]
        return CachedExport(
            exported,
            function,
            dims=dims,
            single_output=exported.out_spec.is_leaf()
            and exported.out_leaves == [OutputSlot(True, 0)],
            owners=owners,
            dtypes=[module_tensor(o, a).dtype for o, a in owners],
            frozen=[(i, frozen[n]) for i, n in enumerate(exported.weights) if n in frozen],
            batch_norms=batch_norms,
        )


class _Forward:
    """``OrtModule.forward``: runs the wrapper, with the wrapped module's own
    ``inspect.signature``.
    """

    def __init__(self, owner: OrtModule) -> None:
        self.owner = owner
        try:
            self.__signature__ = inspect.signature(owner.module.forward)
        except (TypeError, ValueError):  # a builtin or C forward: no signature to show
            self.__signature__ = inspect.signature(owner._call)
        self.__doc__ = owner.module.forward.__doc__ or OrtModule._call.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.owner._call(*args, **kwargs)


def _static_retry(first: ExportError, export: Any) -> Exported:
    """``export()`` with static shapes after a failure with symbolic ones; the first failure when
    both fail.
    """
    try:
        return export()
    except ExportError:
        raise first from None
