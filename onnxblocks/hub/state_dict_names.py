"""Hugging Face state-dict names of an exported model's initializers, by module path and shape.

An exporter keeps a parameter's name (``model.layers.0.input_layernorm.weight``) unless it
transforms the tensor: TorchScript's constant folding stores a Linear's ``[out, in]`` weight
transposed as ``onnx::MatMul_721`` (``[in, out]``), a name that differs between two exports of
the same model (no-cache and with-past). Such a weight is named again after the module of the
MatMul or Gemm that reads it (:func:`onnxblocks.peft.targets.linear_sites`, which reads the
layout from the graph): ``model.layers.0.self_attn.q_proj.weight``, transposed. So a trained
weight keyed by its state-dict name can be written into any export of the model, and into
``model.safetensors``.

Where the state dict itself is known (the hub folder's ``model.safetensors``), each name is
checked against it: the shape decides whether the ONNX tensor is the transpose, and names the
state dict does not hold (buffers, folded constants) are left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from onnxblocks.peft.targets import linear_sites

__all__ = ["StateName", "state_dict_names", "to_onnx_layout", "to_state_layout"]

#: A parameter's name: a module path and a leaf (``model.layers.0.input_layernorm.weight``).
_PARAMETER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+$")


@dataclass(frozen=True)
class StateName:
    """Where an initializer sits in the Hugging Face state dict.

    Attributes:
        name: The state-dict key (``model.layers.0.self_attn.q_proj.weight``).
        transposed: The initializer holds the transpose of the state dict's 2-D tensor.
    """

    name: str
    transposed: bool


def _fits(shape: tuple[int, ...], wanted: tuple[int, ...], hint: bool) -> bool | None:
    """Whether ``shape`` is ``wanted`` transposed (True), as is (False), or neither (None).

    A square weight's shape cannot tell: the graph's layout (``hint``) decides.
    """
    if len(shape) == 2 and shape[::-1] == wanted and (hint or shape != wanted):
        return True
    if shape == wanted:
        return False
    return None


def state_dict_names(
    graph: ir.Graph, reference: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, StateName]:
    """The state-dict name of every initializer of ``graph`` that has one.

    An initializer with a parameter-like name keeps it; one read as a Linear layer's weight under
    another name (a folded transpose) is named ``<module>.weight`` after the module of its MatMul
    or Gemm, transposed when the graph stores it ``[in, out]``.

    Args:
        graph: The exported model's main graph (node names or scope metadata intact).
        reference: The state dict's names and shapes, where known: names it lacks are left out,
            and the shape decides the transpose (GPT-2's ``Conv1D`` stores ``[in, out]`` itself).

    Returns:
        Initializer name -> :class:`StateName`; each state-dict name at most once (the first
        initializer in graph order keeps it).
    """
    found: dict[str, StateName] = {}
    for name in graph.initializers:
        if _PARAMETER.match(name):
            found[name] = StateName(name, False)
    sites, _ = linear_sites(graph)
    for site in sites:
        weight = site.weight.name or ""
        if weight in found or not site.module:
            continue
        found[weight] = StateName(f"{site.module}.weight", site.layout == "in_out")
    out: dict[str, StateName] = {}
    taken: set[str] = set()
    for name, state in found.items():
        if state.name in taken:
            continue
        if reference is not None:
            wanted = reference.get(state.name)
            value = graph.initializers[name]
            dims = list(value.shape) if value.shape is not None else None
            shape = tuple(d for d in dims if isinstance(d, int)) if dims is not None else None
            if wanted is None or shape is None or dims is None or len(shape) != len(dims):
                continue
            transposed = _fits(shape, tuple(wanted), state.transposed)
            if transposed is None:
                continue
            state = StateName(state.name, transposed)
        taken.add(state.name)
        out[name] = state
    return out


def to_state_layout(array: np.ndarray, state: StateName) -> np.ndarray:
    """An initializer's value in the state dict's layout (a C-ordered copy when transposed)."""
    return np.ascontiguousarray(array.T) if state.transposed else array


def to_onnx_layout(array: np.ndarray, state: StateName) -> np.ndarray:
    """A state-dict tensor in the layout of the initializer ``state`` describes."""
    return np.ascontiguousarray(array.T) if state.transposed else array
