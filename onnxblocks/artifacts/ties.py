"""Weights the exporter tied: one initializer that several modules of the model read as their own
parameter.

Exporters merge identical initializers. ``torch.onnx.export(..., dynamo=False)`` with its default
constant
folding, Hugging Face Optimum and dynamo's optimizer keep one of them: the freshly initialized norm
weights (all
ones) and biases (all zeros) of every layer become one initializer, read directly or through
``Identity`` nodes
named after the others. Inference is unchanged, but training then ties them: the modules share one
value and
one gradient (a tiny LLaMA drifts from torch within a few steps).

:func:`find_ties` lists the initializers read by nodes of different modules; :func:`untie` gives
each module
its own copy. The rule (docs/training.md, "Weights the exporter tied"):

* a reader's module is the parameter name of the ``Identity`` it reads through
  (``model.layers.1.input_layernorm.weight`` -> ``model.layers.1.input_layernorm``), else its node's
  scope:
  dynamo's ``pkg.torch.onnx.name_scopes`` metadata, or TorchScript's node name
  (``/model/layers.1/input_layernorm/Mul`` -> ``model.layers.1.input_layernorm``, the ``_1`` of a
  repeated call
  dropped). A reader whose module is unknown, or inside another reader's module, counts with that
  module;
* an initializer with a parameter-like name (or read through ``Identity`` nodes with one) that
  readers of two
  or more modules read is tied;
* the tie is the model's own, kept and not warned about, when its readers are embedding lookups (a
  ``Gather``
  of the weight) and output projections (``MatMul`` / ``Gemm``, directly or through a
  ``Transpose``), at least
  one a lookup: GPT-2's ``lm_head`` and ``wte``, T5's ``shared``, LLaMA with
  ``tie_word_embeddings=True``. Where
  the export carries the model's config (metadata key ``tie_word_embeddings``), its value decides
  for those;
* every other tie is the exporter's.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable, Sequence

import onnx
import onnx_ir as ir

from onnxblocks.ir.names import graph_names
from onnxblocks.ir.serde import from_proto, to_proto
from onnxblocks.ir.walk import Read, reads_through_identity

__all__ = ["TIE_METADATA", "Tie", "find_ties", "untie"]

#: Model metadata key carrying the model's ``config.tie_word_embeddings`` ("true" / "false"), where
#: present.
TIE_METADATA = "tie_word_embeddings"
#: A parameter's name: a module path and a leaf (``model.layers.0.input_layernorm.weight``).
_PARAMETER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+$")
#: The number TorchScript appends to the scope of a module's repeated call (``block.0_1``).
_REPEATED = re.compile(r"_\d+$")
_SCOPES = "pkg.torch.onnx.name_scopes"
_FLOAT = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)


@dataclasses.dataclass(frozen=True)
class Tie:
    """One initializer that the nodes of several modules read.

    Attributes:
        initializer: Its name.
        modules: The modules that read it; the first keeps it when untied.
        copies: For each module after the first, the name its own copy gets from :func:`untie`.
        by_model: The model's own tie (an embedding and output projections): kept, not warned about.
    """

    initializer: str
    modules: tuple[str, ...]
    copies: tuple[str, ...]
    by_model: bool

    def describe(self) -> str:
        """``'w' (read by a, b)``."""
        return f"'{self.initializer}' (read by {', '.join(self.modules)})"


class _Modules:
    """The module of each read, from the graph's parameter names and its nodes' scopes."""

    def __init__(self, graph: ir.Graph) -> None:
        names = [
            *graph.initializers,
            *(v.name for n in graph if n.op_type == "Identity" for v in n.outputs),
        ]
        self.known: set[str] = set()
        for name in names:
            if name and _PARAMETER.match(name):
                parts = name.split(".")[:-1]
                self.known.update(".".join(parts[: i + 1]) for i in range(len(parts)))

    def of(self, read: Read) -> str | None:
        for identity in reversed(read.via):
            name = identity.outputs[0].name or ""
            if _PARAMETER.match(name):
                return name.rsplit(".", 1)[0]
        return self.scope(read.node)

    def scope(self, node: ir.Node) -> str | None:
        """Dynamo's scope metadata, or TorchScript's ``/a/b/Op`` node name as a module path."""
        scopes = node.metadata_props.get(_SCOPES)
        if scopes:
            try:
                names = ast.literal_eval(scopes)
            except (ValueError, SyntaxError):
                names = None
            return (
                str(names[-2])
                if isinstance(names, list) and len(names) >= 2 and names[-2]
                else None
            )
        name = node.name or ""
        if not name.startswith("/"):
            return None
        path: list[str] = []
        for part in name.strip("/").split("/")[:-1]:
            if path and part.startswith(
                path[-1] + "."
            ):  # a Sequential's child: "block" then "block.0"
                part = part[len(path[-1]) + 1 :]
            plain = _REPEATED.sub("", part)  # "block.0_1": the second call of block.0
            if ".".join([*path, part]) not in self.known and ".".join([*path, plain]) in self.known:
                part = plain
            path.append(part)
        return ".".join(path) or None


def _inside(module: str, other: str) -> bool:
    return module == other or module.startswith(other + ".")


def _group(reads: list[Read], modules: _Modules) -> dict[str, list[Read]]:
    """Reads by module, a module inside another's counted with the outer one; unknown modules
    with the first.
    """
    known = [(m, r) for r in reads if (m := modules.of(r)) is not None]
    outer: list[str] = []
    for module in sorted({m for m, _ in known}, key=len):
        if not any(_inside(module, o) for o in outer):
            outer.append(module)
    groups: dict[str, list[Read]] = {}
    for module, read in known:
        groups.setdefault(next(o for o in outer if _inside(module, o)), []).append(read)
    unknown = [r for r in reads if modules.of(r) is None]
    if groups and unknown:
        groups[next(iter(groups))].extend(unknown)
    return groups


def _projection(read: Read) -> bool:
    node, index = read.node, read.index
    if node.op_type == "Transpose" and node.outputs:
        return all(use.op_type in ("MatMul", "Gemm") for use, _ in node.outputs[0].uses())
    return node.op_type in ("MatMul", "Gemm") and index in (0, 1)


def _embedding_tie(reads: list[Read], declared: bool | None) -> bool:
    lookups = [r for r in reads if r.node.op_type == "Gather" and r.index == 0]
    shape = bool(lookups) and all(r in lookups or _projection(r) for r in reads)
    return shape if declared is None else shape and declared


def _declared(graph_meta: dict[str, str]) -> bool | None:
    value = graph_meta.get(TIE_METADATA)
    if value is None:
        return None
    return value.strip().lower() in ("1", "true", "yes")


def _candidates(graph: ir.Graph, extra: Iterable[str]) -> list[ir.Value]:
    wanted = set(extra)
    values = [v for v in graph.inputs if v.name in wanted] + list(graph.initializers.values())
    out = []
    for value in values:
        dtype = value.dtype if value.type is not None else getattr(value.const_value, "dtype", None)
        if dtype in _FLOAT:
            out.append(value)
    return out


def _ties(model: ir.Model, extra: Iterable[str] = ()) -> list[tuple[Tie, dict[str, list[Read]]]]:
    graph = model.graph
    declared = _declared(dict(model.metadata_props))
    modules_of = _Modules(graph)
    found = []
    for value in _candidates(graph, extra):
        reads = reads_through_identity(value)
        name = value.name or ""
        aliases = [r.via[-1].outputs[0].name or "" for r in reads if r.via]
        if not _PARAMETER.match(name) and not any(_PARAMETER.match(a) for a in aliases):
            continue
        groups = _group(reads, modules_of)
        if len(groups) < 2:
            continue
        own = next((m for m in groups if name.startswith(m + ".")), next(iter(groups)))
        modules = [own, *(m for m in groups if m != own)]
        leaf = name.rsplit(".", 1)[-1] if _PARAMETER.match(name) else "weight"
        copies = tuple(_copy_name(groups[m], m, leaf) for m in modules[1:])
        tie = Tie(name, tuple(modules), copies, _embedding_tie(reads, declared))
        found.append((tie, {m: groups[m] for m in modules}))
    return found


def _copy_name(reads: list[Read], module: str, leaf: str) -> str:
    """The name of ``module``'s copy: the parameter name its ``Identity`` has, else
    ``<module>.<leaf>``.
    """
    for read in reads:
        for identity in reversed(read.via):
            name = identity.outputs[0].name or ""
            if _PARAMETER.match(name) and name.startswith(module + "."):
                return name
    return f"{module}.{leaf}"


def _same_data(tensor: ir.TensorProtocol | None, name: str) -> ir.TensorProtocol:
    """A tensor of its own (renaming it renames nothing of the caller's) over the same bytes, not
    copied.

    An external or held weight keeps its file and offset; an inline one is viewed, and written out
    once
    more only when the model is serialized.
    """
    assert tensor is not None, f"initializer {name!r} has no value"
    if isinstance(tensor, ir.ExternalTensor):
        return ir.ExternalTensor(
            tensor.location,
            tensor.offset,
            tensor.length,
            tensor.dtype,
            shape=tensor.shape,
            name=name,
            base_dir=tensor.base_dir,
        )
    return ir.Tensor(tensor.numpy(), dtype=tensor.dtype, name=name)


def find_ties(model: onnx.ModelProto, parameters: Sequence[str] = ()) -> list[Tie]:
    """The initializers (and the graph inputs named in ``parameters``) that nodes of several modules
    read.

    No weight bytes are read: a model loaded without its external data will do.
    """
    return [tie for tie, _ in _ties(from_proto(model), parameters)]


def untie(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[Tie]]:
    """A copy of ``model`` in which each module of an exporter's tie reads its own copy of the
    initializer.

    The model's own ties (an embedding and output projections) stay. Each copy is named after its
    module
    (the parameter name of the ``Identity`` it was read through, or ``<module>.<leaf>``) and holds
    the same
    tensor: an external or held weight keeps its location, so no bytes are read or copied here.
    ``model``
    is not changed.

    Returns:
        The untied model and the ties it undid.
    """
    working = from_proto(model)
    graph = working.graph
    undone = []
    for tie, groups in _ties(working):
        if tie.by_model:
            continue
        source = graph.initializers[tie.initializer]
        made = []
        for module, wanted in zip(tie.modules[1:], tie.copies, strict=True):
            copy = ir.Value(name=None, type=source.type, shape=source.shape)
            for read in groups[module]:
                read.node.replace_input_with(read.index, copy)
            for read in groups[module]:
                for identity in reversed(read.via):
                    if not identity.outputs[0].uses() and identity.graph is graph:
                        graph.remove(identity, safe=True)
            taken = graph_names(
                graph
            )  # the Identity named after the module is gone: its name is free
            copy.name = wanted if not taken.is_used(wanted) else taken.fresh(wanted)
            copy.const_value = _same_data(source.const_value, copy.name)
            graph.register_initializer(copy)
            made.append(copy.name)
        undone.append(dataclasses.replace(tie, copies=tuple(made)))
    return (to_proto(working) if undone else model), undone
