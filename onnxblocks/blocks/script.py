"""Blocks written as onnxscript functions, inlined into the model being built.

An onnxscript function (``@onnxscript.script()``) reads like the maths it
computes. :class:`ScriptBlock` turns one into a block: calling it adds the
function's body to the model, node by node, so the result is a plain graph that
ONNX Runtime can optimize and differentiate::

    from onnxscript import script, opset17 as op

    @script(default_opset=op)
    def weighted(a, b, alpha: float = 0.4):
        return alpha * a + (1.0 - alpha) * b

    with onnxblocks.base(model):
        total = ScriptBlock(weighted, alpha=0.3)(mse, l1)

Inlining rules:

- Every value the body defines gets a fresh name from the graph
  (``<function>.<local name>_<n>``), so nothing the model has is renamed or shadowed.
- Attribute references (``alpha`` above) are replaced by the values given to
  :class:`ScriptBlock` or, failing that, the function's defaults.
- Calls to other onnxscript functions are inlined the same way, recursively.
- ``CastLike(x, like)`` becomes ``Cast(x, to=<dtype of like>)`` when that dtype is
  known: ONNX Runtime 1.19 cannot differentiate ``CastLike``, which onnxscript
  emits for every Python number in an expression.
- The function may not need a newer opset than the model imports (an error says
  so); each node is checked against the model's opset as it is added.

onnxscript itself is never imported here: the block only calls the function
object's ``to_function_proto()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import onnx
from onnx import AttributeProto, helper

from onnxblocks._core.errors import InvalidTypeError, InvalidValueError, did_you_mean, preview
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value

_FunctionKey = tuple[str, str]  # (domain, name)

# Python values of these types convert to the attribute type of a declared default.
_COERCE: dict[int, Callable[[Any], object]] = {
    AttributeProto.FLOAT: lambda v: float(v),
    AttributeProto.INT: lambda v: int(v),
    AttributeProto.FLOATS: lambda v: [float(x) for x in v],
    AttributeProto.INTS: lambda v: [int(x) for x in v],
}


def _function_protos(
    function: Any,
) -> tuple[onnx.FunctionProto, dict[_FunctionKey, onnx.FunctionProto]]:
    """The FunctionProto of ``function`` and those of the functions it calls, keyed by (domain,
    name).

    Raises:
        TypeError: if ``function`` is neither an onnxscript function nor an ``onnx.FunctionProto``.
    """
    if isinstance(function, onnx.FunctionProto):
        return function, {}
    to_proto = getattr(function, "to_function_proto", None)
    if not callable(to_proto):
        hint = (
            " Decorate it with @onnxscript.script() (e.g. `@script(default_opset=opset17)`)."
            if callable(function)
            else ""
        )
        raise InvalidTypeError(
            f"ScriptBlock takes an onnxscript function or an onnx.FunctionProto, not "
            f"{type(function).__name__} {getattr(function, '__name__', '')!s}.{hint}"
        )
    proto = to_proto()
    library: dict[_FunctionKey, onnx.FunctionProto] = {}
    called = getattr(getattr(function, "function_ir", None), "get_called_functions", None)
    for callee in (called() if callable(called) else {}).values():
        callee_proto = callee.to_function_proto()
        library[(callee_proto.domain, callee_proto.name)] = callee_proto
    return proto, library


def _attribute(name: str, value: Any, declared: AttributeProto | None) -> AttributeProto:
    """An AttributeProto for a Python value, of the declared default's type when there is one."""
    if isinstance(value, AttributeProto):
        out = AttributeProto()
        out.CopyFrom(value)
        out.name = name
        return out
    if declared is not None and declared.type in _COERCE:
        try:
            value = _COERCE[declared.type](value)
        except (TypeError, ValueError):
            raise InvalidTypeError(
                f"attribute '{name}' must be "
                f"{AttributeProto.AttributeType.Name(declared.type).lower()}, "
                f"not {type(value).__name__} {value!r}."
            ) from None
    return helper.make_attribute(
        name, value, attr_type=declared.type if declared is not None else None
    )


def _retarget(attr: AttributeProto, name: str, ref_type: int) -> AttributeProto:
    """Copy a supplied attribute under the node's attribute name, converting int/float kinds to
    ``ref_type``.
    """
    if attr.type == ref_type or ref_type == AttributeProto.UNDEFINED or ref_type not in _COERCE:
        out = AttributeProto()
        out.CopyFrom(attr)
        out.name = name
        return out
    return helper.make_attribute(
        name, _COERCE[ref_type](helper.get_attribute_value(attr)), attr_type=ref_type
    )


class ScriptBlock(Block):
    """An onnxscript function as a block whose body is inlined into the model being built.

    Args:
        function: An onnxscript function (decorated with ``@onnxscript.script()``) or
            an ``onnx.FunctionProto``.
        functions: FunctionProtos that a FunctionProto ``function`` calls (onnxscript
            functions find the functions they call themselves).
        **attributes: Values of the function's attributes (its keyword parameters with
            a type annotation such as ``alpha: float``); defaults fill the others.

    Raises:
        TypeError: if ``function`` is not a function, an attribute is unknown, has the
            wrong type, or a required attribute is missing.
    """

    def __init__(
        self, function: Any, *, functions: Iterable[onnx.FunctionProto] = (), **attributes: Any
    ) -> None:
        super().__init__()
        self._proto, self._library = _function_protos(function)
        for extra in functions:
            self._library[(extra.domain, extra.name)] = extra
        self._attributes = self._check_attributes(attributes)

    @property
    def function_name(self) -> str:
        """The name of the inlined function."""
        return self._proto.name

    def _check_attributes(self, attributes: Mapping[str, Any]) -> dict[str, AttributeProto]:
        proto = self._proto
        defaults = {a.name: a for a in proto.attribute_proto}
        known = [*proto.attribute, *defaults]
        out = {}
        for name, value in attributes.items():
            if name not in known:
                raise InvalidTypeError(
                    f"ScriptBlock({proto.name}): unknown attribute "
                    f"'{name}'.{did_you_mean(name, known)} "
                    f"The function's attributes are {preview(known)}."
                )
            try:
                out[name] = _attribute(name, value, defaults.get(name))
            except (TypeError, ValueError) as exc:
                raise InvalidTypeError(f"ScriptBlock({proto.name}): {exc}") from None
        missing = [a for a in proto.attribute if a not in out]
        if missing:
            raise InvalidTypeError(
                f"ScriptBlock({proto.name}): attribute(s) {preview(missing)} have no default; "
                "pass them, e.g. "
                f"ScriptBlock({proto.name}, {missing[0]}=...)."
            )
        return out

    def build(self, *input_names: str | None) -> Value | tuple[Value, ...]:
        """Inline the function on ``input_names`` and return its output(s).

        Args:
            *input_names: One value name per function input, in order; ``None`` (or
                ``""``) for an omitted optional input.

        Returns:
            The function's output as a Value, or a tuple of Values for several outputs.

        Raises:
            TypeError: if the number of inputs differs from the function's.
            UnknownNameError: if an input is not a value of the model.
            ValueError: if the function needs a newer opset than the model imports, or
                a node of its body is invalid at the model's opset.
        """
        acc = self.accessor
        proto = self._proto
        if len(input_names) != len(proto.input):
            raise InvalidTypeError(
                f"{acc.where()}function '{proto.name}' takes {len(proto.input)} input(s) "
                f"({', '.join(proto.input)}) but was given {len(input_names)}."
            )
        for name in input_names:
            if name:
                acc.require(name)
        self._check_opsets(acc)
        outputs = _Inliner(acc, self._library).inline(
            proto, [n or "" for n in input_names], self._attributes, prefix=proto.name
        )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _check_opsets(self, acc: ModelAccessor) -> None:
        """Import the domains the function needs; refuse one the model imports at a lower
        version.
        """
        function_domains = {domain for domain, _ in self._library}
        for proto in (self._proto, *self._library.values()):
            for opset in proto.opset_import:
                domain = "" if opset.domain == "ai.onnx" else opset.domain
                if domain in function_domains:
                    continue
                have = acc.domain_version(domain)
                if have is None:
                    acc.ensure_domain(domain, opset.version)
                elif opset.version > have:
                    shown = domain or "ai.onnx"
                    raise InvalidValueError(
                        f"{acc.where()}function '{proto.name}' uses {shown} opset "
                        f"{opset.version}, but the model "
                        f"imports opset {have}. Write the function against opset {have} (e.g. "
                        f"`from onnxscript import opset{have} as op` and "
                        "@script(default_opset=op)), or convert "
                        "the model: onnx.version_converter.convert_version(model, "
                        f"{opset.version})."
                    )


class _Inliner:
    """Copies function bodies into the graph with fresh names, substituting attributes,
    recursively.
    """

    def __init__(
        self, acc: ModelAccessor, library: Mapping[_FunctionKey, onnx.FunctionProto]
    ) -> None:
        self._acc = acc
        self._library = library

    def inline(
        self,
        proto: onnx.FunctionProto,
        inputs: list[str],
        attributes: Mapping[str, AttributeProto],
        prefix: str,
        depth: int = 0,
    ) -> list[Value]:
        """Add ``proto``'s body on ``inputs``; return the graph names of its outputs."""
        if depth > 32:
            raise InvalidValueError(
                f"function '{proto.name}' calls itself (recursion is not supported in ONNX)."
            )
        scope = {a.name: a for a in proto.attribute_proto}
        scope.update(attributes)
        env = dict(zip(proto.input, inputs, strict=True))
        for index, node in enumerate(proto.node):
            node_inputs = [self._lookup(env, name, proto, node) for name in node.input]
            node_attributes = _resolve_attributes(node.attribute, scope)
            callee = self._library.get((node.domain, node.op_type))
            if callee is not None:
                results = self.inline(
                    callee,
                    node_inputs,
                    {a.name: a for a in node_attributes},
                    prefix=f"{prefix}.{callee.name}",
                    depth=depth + 1,
                )
                env.update(dict(zip(node.output, results, strict=False)))
                continue
            out_names = [self._acc.names.fresh(f"{prefix}.{o}") if o else "" for o in node.output]
            self._add_node(proto, index, node, node_inputs, node_attributes, out_names)
            env.update({o: n for o, n in zip(node.output, out_names, strict=True) if o})
        return [Value(self._lookup(env, name, proto, None)) for name in proto.output]

    @staticmethod
    def _lookup(
        env: Mapping[str, str], name: str, proto: onnx.FunctionProto, node: onnx.NodeProto | None
    ) -> str:
        if not name:
            return ""
        if name not in env:
            where = f"node {node.op_type}" if node is not None else "its outputs"
            raise InvalidValueError(
                f"function '{proto.name}' uses value '{name}' in {where} before defining it."
            )
        return env[name]

    def _add_node(
        self,
        proto: onnx.FunctionProto,
        index: int,
        node: onnx.NodeProto,
        inputs: list[str],
        attributes: list[AttributeProto],
        outputs: list[str],
    ) -> None:
        acc = self._acc
        op_type, domain = node.op_type, node.domain
        like_type = (
            acc.elem_type(inputs[1])
            if op_type == "CastLike" and domain in ("", "ai.onnx")
            else None
        )
        if like_type:  # ORT cannot differentiate CastLike; Cast to the same type it can
            op_type, inputs = "Cast", inputs[:1]
            attributes = [*attributes, helper.make_attribute("to", like_type)]
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in attributes):
            raise InvalidValueError(
                f"{acc.where()}function '{proto.name}' node {index} ({op_type}) has a "
                "control-flow body; "
                "ScriptBlock inlines straight-line functions only. Write the loss without "
                "If/Loop/Scan "
                "(e.g. with Where), or add the nodes with accessor.op()."
            )
        plain = {a.name: helper.get_attribute_value(a) for a in attributes if not _is_empty_list(a)}
        try:
            acc.op(op_type, inputs, domain=domain, outputs=outputs, **plain)
        except (TypeError, ValueError) as exc:
            versions = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
            kind = TypeError if isinstance(exc, TypeError) else ValueError
            raise kind(
                f"{exc} (while inlining node {index} ({node.op_type}) of function "
                f"'{proto.name}', written for "
                f"opsets {versions})"
            ) from None
        acc.annotate_last_node([a for a in attributes if _is_empty_list(a)], node.doc_string)


def _is_empty_list(attr: AttributeProto) -> bool:
    return attr.type in (
        AttributeProto.FLOATS,
        AttributeProto.INTS,
        AttributeProto.STRINGS,
    ) and not (attr.floats or attr.ints or attr.strings)


def _resolve_attributes(
    attributes: Iterable[AttributeProto], scope: Mapping[str, AttributeProto]
) -> list[AttributeProto]:
    """Replace attribute references (``ref_attr_name``) by their values; drop those with no
    value.
    """
    out = []
    for attr in attributes:
        if not attr.ref_attr_name:
            out.append(attr)
            continue
        supplied = scope.get(attr.ref_attr_name)
        if supplied is not None:
            out.append(_retarget(supplied, attr.name, attr.type))
    return out


def from_onnxscript(function: Any, **attributes: Any) -> ScriptBlock:
    """Turn an onnxscript function into a block (same as ``ScriptBlock(function,
    **attributes)``).
    """
    return ScriptBlock(function, **attributes)
