"""The structure of a module's output around ONNX Runtime's outputs: which leaf is which tensor, and
dataclasses.

:func:`output_plan` reads the eager run's output leaves: a tensor the module returns
twice is one graph output, an argument returned unchanged stays the caller's tensor
(as torch returns it), and other leaves are constants. :func:`register_dataclasses`
teaches torch's pytree the dataclasses a module takes or returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["CONSTANT_TYPES", "OutputSlot", "output_plan", "register_dataclasses"]


@dataclass(frozen=True)
class OutputSlot:
    """Where a tensor leaf of the module's output comes from.

    Attributes:
        graph: True: graph output ``index`` (a tensor returned twice has one graph output);
            False: tensor argument ``index`` of the call, returned unchanged (as torch returns it).
        index: The position in the graph outputs, or among the tensor leaves of ``(args, kwargs)``.
    """

    graph: bool
    index: int


#: Non-tensor leaves an output may hold (returned as the export's eager run computed them).
CONSTANT_TYPES = (
    int,
    float,
    bool,
    complex,
    str,
    bytes,
    type(None),
    torch.Size,
    torch.dtype,
    torch.device,
)


def register_dataclasses(tree: Any) -> None:
    """Teach torch's pytree the dataclasses inside ``tree`` (arguments or outputs), so their tensors
    are leaves.

    ``ModelOutput`` (Hugging Face) is registered by transformers itself.
    """
    stack = [tree]
    while stack:
        item = stack.pop()
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            if type(item) not in pytree.SUPPORTED_NODES:
                with contextlib.suppress(
                    Exception
                ):  # not registrable: it stays a leaf, and is refused as one
                    torch.export.register_dataclass(type(item))
            stack.extend(getattr(item, f.name, None) for f in dataclasses.fields(item))
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


def output_plan(leaves: list[Any], inputs: list[torch.Tensor]) -> tuple[list[Any], list[int]]:
    """Each output leaf as an :class:`OutputSlot` or a constant, and the leaves that become graph
    outputs.

    An input returned unchanged stays the caller's tensor (no graph output, as torch returns it),
    and a
    tensor returned several times is one graph output.
    """
    plan: list[Any] = []
    graph_outputs: list[int] = []
    seen: dict[int, int] = {}
    for position, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            plan.append(leaf)
            continue
        argument = next((j for j, t in enumerate(inputs) if t is leaf), None)
        if argument is not None:
            plan.append(OutputSlot(False, argument))
            continue
        if id(leaf) not in seen:
            seen[id(leaf)] = len(graph_outputs)
            graph_outputs.append(position)
        plan.append(OutputSlot(True, seen[id(leaf)]))
    return plan, graph_outputs
