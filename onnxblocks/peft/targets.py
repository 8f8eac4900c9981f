"""Finding LoRA targets: the MatMul or Gemm node of a torch Linear (or Conv1D) module, by the
module's name.

A torch module's path (``model.layers.0.self_attn.q_proj``) survives export in three places,
read in this order:

1. the dynamo exporter (``torch.onnx.export(dynamo=True)``) writes each node's module scopes in
   its metadata ``pkg.torch.onnx.name_scopes`` (``['', 'model', ...,
   'model.layers.0.self_attn.q_proj',
   'linear']``: the second to last is the module the op ran in), and in ``namespace``
   (``...model.layers.0.self_attn.q_proj: torch.nn.modules.linear.Linear/linear:
   aten.linear.default``);
2. the TorchScript exporter (``dynamo=False``) names each node after its scope
   (``/model/layers.0/self_attn/q_proj/MatMul``);
3. a graph without either: the weight initializer's name
   (``model.layers.0.self_attn.q_proj.weight``).

The weight is traced from the node's second input back through ``Transpose`` and ``Identity`` to
an initializer: TorchScript reads a Linear's ``[out, in]`` weight through a ``Transpose``, or, with
constant folding, stores it transposed as ``onnx::MatMul_N`` (``[in, out]``); a ``Gemm`` reads it
with ``transB=1``; GPT-2's ``Conv1D`` stores ``[in, out]`` itself. The layout is read from the
graph,
never guessed from the weight's name.

Targets match module paths by PEFT's rule: a list of names matches a module whose path is a name
or ends with ``.name``; a string is a regex matched against the whole path.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError, preview
from onnxblocks.ir.attributes import int_attribute
from onnxblocks.peft.config import LoraConfig

__all__ = [
    "ALL_LINEAR",
    "LinearSite",
    "find_targets",
    "linear_sites",
    "matches",
    "resolve_all_linear",
]

#: Node metadata key where the dynamo exporter lists the module scopes a node ran in.
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
#: Node metadata key where the dynamo exporter writes the module path and class of each scope.
NAMESPACE = "namespace"
#: PEFT's shorthand for every Linear layer but the output layer.
ALL_LINEAR = "all-linear"
_LINEAR_OPS = ("MatMul", "Gemm")
_PASS_THROUGH = ("Identity",)


@dataclass(frozen=True)
class LinearSite:
    """A node that applies a constant weight to its input: a Linear layer as exported.

    Attributes:
        module: The torch module path the node belongs to.
        node: The MatMul or Gemm node (its first input is the layer's input).
        weight: The weight initializer's value.
        layout: ``"out_in"`` if the graph stores the weight ``[out, in]``, ``"in_out"`` if ``[in,
        out]``.
        in_features: The layer's input width.
        out_features: The layer's output width.
        quantized: The weight is stored quantized and dequantized in the graph
            (:mod:`onnxblocks.peft.quantized`).
    """

    module: str
    node: ir.Node
    weight: ir.Value
    layout: str
    in_features: int
    out_features: int
    quantized: bool = False


def matches(config: LoraConfig, module: str) -> bool:
    """Whether ``config`` targets the module ``module`` (PEFT's rule, ``exclude_modules`` first)."""
    if _rule(config.exclude_modules, module):
        return False
    return _rule(config.target_modules, module)


def _rule(rule: tuple[str, ...] | str | None, module: str) -> bool:
    if rule is None:
        return False
    if isinstance(rule, str):
        return re.fullmatch(rule, module) is not None
    return module in rule or any(module.endswith(f".{name}") for name in rule)


def node_module(node: ir.Node) -> str | None:
    """The torch module path ``node`` was exported from, from either exporter's records, or None."""
    scopes = node.metadata_props.get(NAME_SCOPES)
    if scopes:
        try:
            parsed = ast.literal_eval(scopes)
        except (ValueError, SyntaxError):
            parsed = None
        if (
            isinstance(parsed, list)
            and len(parsed) >= 2
            and all(isinstance(s, str) for s in parsed)
        ):
            return parsed[-2]
    namespace = node.metadata_props.get(
        NAMESPACE
    )  # ": Root/path: Class/.../op: aten.op" (older dynamo exports)
    if namespace and namespace.count("/") >= 1:
        return namespace.split("/")[-2].split(": ")[0]
    name = node.name or ""
    if name.startswith("/"):
        return ".".join(name.split("/")[1:-1])
    return None


def _modules(module: str) -> list[str]:
    """``module`` and its ancestors (``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``; ``layers.0`` stays
    one step).
    """
    if not module:
        return []
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _trace_weight(value: ir.Value | None, graph: ir.Graph) -> tuple[ir.Value | None, bool, str]:
    """Follow ``value`` back through Transpose/Identity to an initializer.

    Returns:
        ``(initializer value or None, transposed on the way, what was found instead)``.
    """
    transposed = False
    while value is not None:
        if value.is_initializer() and graph.initializers.get(value.name or "") is value:
            return value, transposed, ""
        producer = value.producer()
        if producer is None:
            return None, transposed, f"graph input {value.name!r}"
        if producer.op_type == "Transpose" and producer.domain in ("", "ai.onnx"):
            perm = producer.attributes.get("perm")
            if perm is not None and list(perm.as_ints()) != [1, 0]:
                return (
                    None,
                    transposed,
                    f"Transpose {producer.name!r} with perm {list(perm.as_ints())}",
                )
            transposed = not transposed
        elif producer.op_type not in _PASS_THROUGH:
            return None, transposed, f"{producer.op_type} node {producer.name!r}"
        value = producer.inputs[0]
    return None, transposed, "no input"


def _site(node: ir.Node, module: str, graph: ir.Graph) -> tuple[LinearSite | None, str]:
    """The Linear site of a MatMul/Gemm node, or None and why not."""
    if len(node.inputs) < 2 or node.inputs[0] is None:
        return None, f"{node.op_type} {node.name!r} has no two inputs"
    weight, transposed, found = _trace_weight(node.inputs[1], graph)
    if weight is None:
        return (
            None,
            f"{node.op_type} {node.name!r} reads its second input from {found}, not a weight "
            "initializer",
        )
    if node.op_type == "Gemm":
        if int_attribute(node, "transA", 0):
            return None, f"Gemm {node.name!r} has transA=1 (its input is transposed)"
        transposed ^= bool(int_attribute(node, "transB", 0))
    shape = weight.shape
    dims = [d for d in shape if isinstance(d, int)] if shape is not None else []
    if shape is None or len(shape) != 2 or len(dims) != 2:
        return (
            None,
            f"{node.op_type} {node.name!r} reads weight {weight.name!r} of shape {shape}, not 2-D",
        )
    rows, cols = dims
    layout = "out_in" if transposed else "in_out"
    in_features, out_features = (cols, rows) if transposed else (rows, cols)
    site = LinearSite(module, node, weight, layout, in_features, out_features)
    return site, ""


def linear_sites(
    graph: ir.Graph, known: Mapping[ir.Node, LinearSite] | None = None
) -> tuple[list[LinearSite], dict[str, list[str]]]:
    """Every Linear-like node of ``graph`` (top level), and what each module's own nodes are.

    ``known``: sites found otherwise (a quantized layer's float MatMul), taken as they are.

    Returns:
        ``(sites, module_ops)``: the sites in graph order; for every module path seen (ancestors
        included), a description of its own MatMul/Gemm nodes that are not sites, for error messages
        (under ``""``: the Linear nodes no module name was found for).
    """
    sites: list[LinearSite] = []
    module_ops: dict[str, list[str]] = {}
    for node in graph:
        module = node_module(node)
        if known and node in known:
            sites.append(known[node])
            module = known[node].module
        elif node.op_type in _LINEAR_OPS and node.domain in ("", "ai.onnx"):
            site, why = _site(node, module or "", graph)
            if (
                site is not None and module is None
            ):  # no scope: the weight's own name, if it is a parameter's
                name = site.weight.name or ""
                module = name[: -len(".weight")] if name.endswith(".weight") else None
                if (
                    module is None
                ):  # a Linear layer without a module name: said when targets match nothing
                    module_ops.setdefault("", []).append(
                        f"{node.op_type} {node.name!r} (weight {name!r})"
                    )
                site = dataclasses.replace(site, module=module) if module else None
            if site is not None:
                sites.append(site)
            elif module:
                module_ops.setdefault(module, []).append(why)
        for path in _modules(module or ""):
            module_ops.setdefault(path, [])
    return sites, module_ops


def _describe(rule: tuple[str, ...] | str | None) -> str:
    return repr(rule) if isinstance(rule, str) else repr(list(rule or ()))


def _is_all_linear(rule: tuple[str, ...] | str | None) -> bool:
    return isinstance(rule, str) and rule.lower() == ALL_LINEAR


def _feeds_output(node: ir.Node, outputs: set[ir.Value]) -> bool:
    """Whether ``node``'s result is a graph output, itself or after one ``Add`` of a constant (a
    bias).
    """
    value = node.outputs[0]
    if value in outputs:
        return True
    uses = list(value.uses())
    if len(uses) != 1 or uses[0].node.op_type != "Add":
        return False
    add = uses[0].node
    other = [v for v in add.inputs if v is not value]
    return (
        len(other) == 1
        and other[0] is not None
        and other[0].is_initializer()
        and add.outputs[0] in outputs
    )


def resolve_all_linear(
    graph: ir.Graph, config: LoraConfig, known: Mapping[ir.Node, LinearSite] | None = None
) -> LoraConfig:
    """``config`` with ``target_modules="all-linear"`` replaced by the module paths it stands for
    (PEFT's way).

    PEFT's ``all-linear`` is every Linear and ``Conv1D`` module but the output layer (a language
    model's
    output embedding, a classifier head). Here: every Linear site but those whose result is a model
    output,
    itself or after a bias ``Add``, and but ``exclude_modules``. Other configs come back as they
    are.

    Raises:
        InvalidValueError: no Linear layer is left.
    """
    if not _is_all_linear(config.target_modules):
        return config
    sites, _ = linear_sites(graph, known)
    outputs = set(graph.outputs)
    heads = {s.module for s in sites if _feeds_output(s.node, outputs)}
    modules = [
        s.module
        for s in sites
        if s.module not in heads and not _rule(config.exclude_modules, s.module)
    ]
    if not modules:
        raise InvalidValueError(
            "LoraConfig target_modules='all-linear' finds no Linear layer besides the output "
            f"layer {sorted(heads)}"
        )
    return dataclasses.replace(config, target_modules=tuple(dict.fromkeys(modules)))


def find_targets(
    graph: ir.Graph, config: LoraConfig, known: Mapping[ir.Node, LinearSite] | None = None
) -> list[LinearSite]:
    """The Linear sites ``config.target_modules`` selects, in graph order.

    Raises:
        InvalidValueError: ``target_modules`` is None; it matches no module; it matches a module
        that is
            not a Linear layer with a float32 constant weight, or a module applied by more than one
            node
            (each message names the module and what was found).
    """
    config = resolve_all_linear(graph, config, known)
    sites, module_ops = linear_sites(graph, known)
    linear = sorted({s.module for s in sites})
    if config.target_modules is None:
        raise InvalidValueError(
            f"LoraConfig target_modules={config.target_modules!r}: name the modules to adapt "
            f"(e.g. ['q_proj', 'v_proj']); this model's Linear modules: {preview(linear)}"
        )
    by_module: dict[str, list[LinearSite]] = {}
    for site in sites:
        by_module.setdefault(site.module, []).append(site)
    matched = sorted(m for m in {*module_ops, *by_module} if m and matches(config, m))
    if not matched:
        anonymous = module_ops.get("", [])
        unnamed = (
            f"; {len(anonymous)} Linear nodes carry no module name (no exporter scope, and a "
            "weight not named "
            f"<module>.weight): {preview(anonymous, 4)}"
            if anonymous
            else ""
        )
        raise InvalidValueError(
            f"LoraConfig target_modules={_describe(config.target_modules)} matches no module of "
            "the model"
            f"{' (after exclude_modules)' if config.exclude_modules else ''}; its Linear "
            f"modules: {preview(linear)}"
            f"{unnamed}"
        )
    chosen: list[LinearSite] = []
    for module in matched:
        found = by_module.get(module, [])
        if not found:
            why = (
                "; ".join(module_ops.get(module, [])) or "it has no MatMul or Gemm node of its own"
            )
            raise InvalidValueError(
                f"LoRA target module {module!r} (matched by "
                f"target_modules={_describe(config.target_modules)}) "
                f"is not a Linear layer with a constant weight: {why}. Target Linear modules "
                "only, e.g. "
                f"{preview(linear, 4)}"
            )
        if len(found) > 1:
            nodes = [s.node.name or s.node.op_type for s in found]
            raise InvalidValueError(
                f"LoRA target module {module!r} is applied by {len(found)} nodes "
                f"({preview(nodes)}): onnxblocks "
                "adapts a Linear module called once; exclude it with exclude_modules"
            )
        site = found[0]
        dtype = site.weight.dtype
        if dtype != ir.DataType.FLOAT and not site.quantized:
            raise InvalidValueError(
                f"LoRA target module {module!r}: weight {site.weight.name!r} is {dtype}; "
                "onnxblocks applies LoRA "
                "to float32 models: export the model in float32"
            )
        chosen.append(site)
    order = {node: i for i, node in enumerate(graph)}
    return sorted(chosen, key=lambda s: order[s.node])
