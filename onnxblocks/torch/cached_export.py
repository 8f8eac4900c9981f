"""One cached export of an :class:`~onnxblocks.torch.module.OrtModule` call signature, and the
module tensors it reads.

A call's signature includes its non-tensor arguments (:func:`call_constants`), which the export
bakes into the graph; the tensors an export reads are looked up on their owning submodule at every
call (:func:`module_weights`), so that the module's own parameters are fed without copies.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from onnxblocks._core.errors import InvalidTypeError, StateError
from onnxblocks.torch.embedding import FrozenWeight
from onnxblocks.torch.exported import Exported
from onnxblocks.torch.function import OnnxFunction


@dataclass
class CachedExport:
    """One cached export: the graph, its Function, and how to find the tensors it reads."""

    exported: Exported | None  # None: this signature runs eagerly
    function: type[OnnxFunction] | None = None
    dims: list[list[int | None] | None] = field(default_factory=list)
    owners: list[tuple[torch.nn.Module, str]] = field(default_factory=list)
    dtypes: list[torch.dtype] = field(default_factory=list)
    #: BatchNorm modules to update, each with where its normalised batch is: a graph input or an
    #: extra output.
    batch_norms: list[tuple[torch.nn.Module, bool, int]] = field(default_factory=list)
    #: The module returns one tensor (no pytree to rebuild).
    single_output: bool = False
    #: Weights fed detached (frozen copies for Embedding's gradient semantics), by position among
    #: the weights.
    frozen: list[tuple[int, FrozenWeight]] = field(default_factory=list)


def call_constants(leaves: list[Any]) -> tuple[Hashable, ...]:
    """The non-tensor leaves of a call, as part of its signature."""
    found: list[Hashable] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            continue
        try:
            hash(leaf)
        except TypeError:
            raise InvalidTypeError(
                "OrtModule bakes non-tensor arguments into the exported graph, and "
                f"{type(leaf).__name__} "
                f"{leaf!r} is not hashable: pass tensors, numbers, strings or None."
            ) from None
        found.append((type(leaf), leaf))
    return tuple(found)


def module_weights(entry: CachedExport) -> list[torch.Tensor]:
    """The module's tensors an export reads, in order (frozen copies detached)."""
    weights = [module_tensor(o, a) for o, a in entry.owners]
    for position, spec in entry.frozen:
        tensor = weights[position].detach()
        weights[position] = tensor if spec.row is None else tensor[spec.row : spec.row + 1]
    return weights


def tensor_owner(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """The submodule that holds the tensor ``name`` (a qualified name), and its attribute."""
    path, _, attr = name.rpartition(".")
    return (module.get_submodule(path) if path else module), attr


def module_tensor(owner: torch.nn.Module, attr: str) -> torch.Tensor:
    """The parameter or buffer ``attr`` of ``owner`` as it is now (it may have been replaced)."""
    found: torch.Tensor | None = owner._parameters.get(attr)
    if found is None:
        found = owner._buffers[attr]
    if found is None:
        raise StateError(
            f"The module's tensor '{attr}' of {type(owner).__name__} is None; it was exported as "
            "one."
        )
    return found
