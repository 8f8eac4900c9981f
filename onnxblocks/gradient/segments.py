"""Recomputation's segments: the module path of each node, and the policies that group nodes.

A node's module path is read from the dynamo exporter's ``pkg.torch.onnx.name_scopes`` metadata
(of the forward model: ONNX Runtime's gradient builder drops node metadata but keeps names), else
from the TorchScript exporter's node name (``/model/layers.3/self_attn/MatMul``), else from its
output names (LoRA's ``model.layers.3.self_attn.q_proj.lora.matmul_0``). ``"layers"`` groups the
nodes of each repeated block (``layers.N``, ``layer.N``, ``h.N``, ``blocks.N``, ``block.N``); a
list of module paths groups the nodes under each path; ``"auto"`` and a byte budget choose among
the blocks ``"layers"`` finds (``recompute_plan.py``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping

import onnx_ir as ir

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, UnknownNameError, preview

__all__ = ["check_found", "check_recompute", "module_scopes", "segment_of"]

#: The dynamo exporter's metadata key listing the module scopes a node ran in.
_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
#: A repeated block's module path: ``...layers.3``, ``...encoder.layer.3``, ``...h.3``.
_REPEATED = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|blocks|block)\.\d+)(?:\.|$)")


def check_recompute(recompute: object) -> str | int | tuple[str, ...]:
    """``recompute`` as the pass takes it: ``"none"``, ``"layers"``, ``"auto"``, a byte budget
    (a positive int) or a tuple of module paths.

    Raises:
        InvalidTypeError: for a value that is neither a str, an int nor a list of str.
        InvalidValueError: for another string, a budget below 1 byte, or an empty list or path.
    """
    if recompute is None:
        return "none"
    if isinstance(recompute, str):
        if recompute in ("none", "layers", "auto"):
            return recompute
        raise InvalidValueError(
            f"recompute={recompute!r} is not a policy: pass 'none', 'layers' (every repeated "
            "block: model.layers.N, encoder.layer.N, h.N...), 'auto', a byte budget (an int) "
            "or a list of module paths (['model.layers.0', 'model.layers.1'])."
        )
    if isinstance(recompute, int) and not isinstance(recompute, bool):
        if recompute < 1:
            raise InvalidValueError(
                f"recompute={recompute} is not a byte budget: pass the bytes of activations the "
                "backward may keep (a positive int, e.g. 64 * 2**20), or 'auto'."
            )
        return recompute
    if isinstance(recompute, (list, tuple)) and all(isinstance(p, str) for p in recompute):
        paths = tuple(p.strip(".") for p in recompute)
        if not paths or not all(paths):
            raise InvalidValueError(
                f"recompute={list(recompute)!r} names no module path: list the module paths "
                "whose forward is recomputed, e.g. ['model.layers.0'], or pass 'layers'."
            )
        return paths
    raise InvalidTypeError(
        f"recompute must be 'none', 'layers', 'auto', a byte budget (int) or a list of module "
        f"paths, not {type(recompute).__name__}: {recompute!r}."
    )


def module_scopes(model: ir.Model) -> dict[str, str]:
    """Node name -> module path, from the dynamo exporter's metadata of ``model``'s nodes.

    ONNX Runtime's gradient builder drops node metadata but keeps node names, so the forward
    model's scopes are read before it runs.
    """
    scopes: dict[str, str] = {}
    for node in model.graph:
        text = node.metadata_props.get(_NAME_SCOPES)
        path = _innermost(text) if text and node.name else None
        if path and node.name:
            scopes[node.name] = path
    return scopes


def _innermost(text: str) -> str | None:
    try:
        listed = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    dotted = [s for s in listed if isinstance(s, str) and s] if isinstance(listed, list) else []
    return max(dotted, key=len) if dotted else None


def _paths(node: ir.Node, scopes: Mapping[str, str]) -> Iterable[str]:
    """Dotted module paths ``node`` may carry, the most reliable first."""
    if node.name and node.name in scopes:
        yield scopes[node.name]
    text = node.metadata_props.get(_NAME_SCOPES)
    inner = _innermost(text) if text else None
    if inner:
        yield inner
    if node.name and "/" in node.name:
        yield node.name.strip("/").replace("/", ".")
    for out in node.outputs:
        if out.name:
            yield out.name.strip("/").replace("/", ".")


def segment_of(
    node: ir.Node, policy: str | int | tuple[str, ...], scopes: Mapping[str, str]
) -> str | None:
    """The segment ``node`` belongs to under ``policy`` (a block's or a named module path), or
    None. ``"auto"`` and byte budgets take the blocks ``"layers"`` takes, as candidates.
    """
    for path in _paths(node, scopes):
        if not isinstance(policy, tuple):
            match = _REPEATED.match(path)
            if match:
                return match.group(1)
            continue
        for prefix in policy:
            if path == prefix or path.startswith(prefix + "."):
                return prefix
    return None


def check_found(policy: str | int | tuple[str, ...], groups: dict[str, list[ir.Node]]) -> None:
    """Refuse a policy that found nothing: ``"layers"`` without blocks, or unknown module paths.

    Raises:
        InvalidValueError: for ``"layers"`` on a model without repeated blocks.
        UnknownNameError: for module paths no forward node belongs to.
    """
    if not isinstance(policy, tuple):
        if not groups:
            raise InvalidValueError(
                f"recompute={policy!r} found no repeated block in the model (module paths such as "
                "model.layers.N, encoder.layer.N, h.N in node names or exporter metadata): name "
                "the blocks with recompute=['<module path>', ...], or pass recompute='none'."
            )
        return
    missing = [p for p in policy if p not in groups]
    if missing:
        raise UnknownNameError(
            f"recompute names module paths no forward node of the model belongs to: "
            f"{preview(missing)}. Name modules as torch does (model.layers.0), or pass 'layers'."
        )
