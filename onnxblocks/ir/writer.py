"""Building the nodes of one rewrite: fresh names, and the opset-dependent forms of ops written
once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnx_ir as ir

from onnxblocks._core.errors import InvalidValueError
from onnxblocks._core.naming import NameAuthority

#: Largest int64: an open end for ``Slice``.
INT64_MAX = int(np.iinfo(np.int64).max)


def node_from_proto(node: onnx.NodeProto, values: Mapping[str, ir.Value]) -> ir.Node:
    """The IR node of a ``NodeProto`` built and checked outside the IR (the DSL checks each node
    with onnx's checker, which takes protobuf): its inputs are ``values`` by name, its
    attributes as onnx encoded them, its outputs new values of the proto's output names.
    """
    return ir.Node(
        node.domain,
        node.op_type,
        [values[name] if name else None for name in node.input],
        attributes=[ir.serde.deserialize_attribute(a) for a in node.attribute],
        outputs=[ir.Value(name=name) for name in node.output],
        name=node.name,
    )


class Writer:
    """Writes the nodes of one rewrite into :attr:`nodes` (not yet in any graph).

    Each method appends its nodes and returns the (first) output value. ``out=``
    names an output (e.g. the name of the value being replaced); other outputs get
    fresh names ``<hint>.<suffix>_<n>`` from the graph's name authority. Ops whose
    form changed across opsets (inputs that were attributes) are written in the
    form the model's opset has.
    """

    def __init__(self, names: NameAuthority, opset: int, hint: str) -> None:
        self.names = names
        self.opset = opset
        self.hint = hint
        self.nodes: list[ir.Node] = []

    # ----------------------------------------------------------------- core
    def fresh(self, suffix: str) -> str:
        """A new value name ``<hint>.<suffix>_<n>``."""
        return self.names.fresh(f"{self.hint}.{suffix}")

    def ops(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        outputs: Sequence[str | ir.Value],
        domain: str = "",
        **attrs: Any,
    ) -> list[ir.Value]:
        """One node with the given outputs (names, or fresh values); ``attrs`` as onnx-ir
        converts them.
        """
        values = [o if isinstance(o, ir.Value) else ir.Value(name=o) for o in outputs]
        node = ir.Node(
            domain,
            op_type,
            list(inputs),
            attributes=ir.convenience.convert_attributes(
                {k: v for k, v in attrs.items() if v is not None}
            ),
            outputs=values,
            name=self.names.fresh(op_type),
        )
        self.nodes.append(node)
        return list(node.outputs)

    def op(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        out: str | ir.Value | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> ir.Value:
        """One node with one output."""
        (value,) = self.ops(
            op_type,
            inputs,
            [out if out is not None else self.fresh(op_type.lower())],
            domain,
            **attrs,
        )
        return value

    def const(
        self,
        value: np.ndarray | float | int | list,
        dtype: npt.DTypeLike | None = None,
        suffix: str = "const",
    ) -> ir.Value:
        """A ``Constant`` node holding ``value`` (numpy dtype ``dtype``)."""
        return self.named_const(self.fresh(suffix), np.asarray(value, dtype=dtype))

    def named_const(self, name: str, value: np.ndarray) -> ir.Value:
        """A ``Constant`` node whose output is named ``name``, its type, shape and value known.

        Built from IR classes directly: ``ir.tensor`` and attribute inference check
        runtime protocols, which costs more than the rest of a rewrite on graphs of a
        thousand nodes.
        """
        array = np.asarray(value)
        tensor = ir.Tensor(array, name=name)
        out = ir.Value(
            name=name,
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            shape=ir.Shape(array.shape),
        )
        node = ir.Node(
            "",
            "Constant",
            [],
            attributes=[ir.AttrTensor("value", tensor)],
            outputs=[out],
            name=self.names.fresh("Constant"),
        )
        self.nodes.append(node)
        out.const_value = tensor
        return out

    def ints(self, values: Sequence[int]) -> ir.Value:
        """An int64 1-D constant."""
        return self.const(np.array(list(values), dtype=np.int64), suffix="ints")

    def scalar(
        self, value: float | int, dtype: npt.DTypeLike = np.float32, shape: Sequence[int] = ()
    ) -> ir.Value:
        """A constant of ``dtype`` holding ``value``, of shape ``shape`` (a scalar by default)."""
        return self.const(np.full(tuple(shape), value, dtype=dtype), suffix="scalar")

    # ----------------------------------------------- opset-dependent forms
    def unsqueeze(
        self, x: ir.Value, axes: Sequence[int], out: str | ir.Value | None = None
    ) -> ir.Value:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)], out)
        return self.op("Unsqueeze", [x], out, axes=list(axes))

    def squeeze(
        self, x: ir.Value, axes: Sequence[int], out: str | ir.Value | None = None
    ) -> ir.Value:
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.ints(axes)], out)
        return self.op("Squeeze", [x], out, axes=list(axes))

    def reduce(
        self,
        op_type: str,
        x: ir.Value,
        axes: ir.Value | Sequence[int] | None,
        keepdims: int = 1,
        out: str | ir.Value | None = None,
        **attrs: Any,
    ) -> ir.Value:
        """``ReduceSum`` / ``ReduceMean`` / ... over ``axes`` (a list, or an int64 value at opset 13
        / 18 on).

        Raises:
            ValueError: for run-time axes (a value) at an opset that takes them only as an
            attribute.
        """
        axes_input_since = 13 if op_type == "ReduceSum" else 18
        if axes is None:
            return self.op(op_type, [x], out, keepdims=keepdims, **attrs)
        if self.opset >= axes_input_since:
            axes_value = axes if isinstance(axes, ir.Value) else self.ints(list(axes))
            return self.op(op_type, [x, axes_value], out, keepdims=keepdims, **attrs)
        if isinstance(axes, ir.Value):
            raise InvalidValueError(
                f"{op_type} takes run-time axes from opset {axes_input_since}; the model has "
                f"{self.opset}"
            )
        return self.op(op_type, [x], out, axes=list(axes), keepdims=keepdims, **attrs)

    def reduce_mean(
        self, x: ir.Value, axes: Sequence[int], keepdims: int = 1, out: str | ir.Value | None = None
    ) -> ir.Value:
        return self.reduce("ReduceMean", x, axes, keepdims, out)

    def slice(
        self,
        x: ir.Value,
        starts: Sequence[int],
        ends: Sequence[int],
        axes: Sequence[int],
        steps: Sequence[int] | None = None,
        out: str | ir.Value | None = None,
    ) -> ir.Value:
        inputs = [x, self.ints(starts), self.ints(ends), self.ints(axes)]
        if steps is not None:
            inputs.append(self.ints(steps))
        return self.op("Slice", inputs, out)

    def split(
        self,
        x: ir.Value,
        lengths: Sequence[int],
        axis: int,
        outputs: Sequence[str | ir.Value] | None = None,
    ) -> list[ir.Value]:
        names: Sequence[str | ir.Value] = outputs or [self.fresh("piece") for _ in lengths]
        if self.opset >= 13:
            return self.ops("Split", [x, self.ints(lengths)], names, axis=axis)
        return self.ops("Split", [x], names, axis=axis, split=list(lengths))

    def pad(self, x: ir.Value, pads: Sequence[int], out: str | ir.Value | None = None) -> ir.Value:
        if self.opset >= 11:
            return self.op("Pad", [x, self.ints(pads)], out)
        return self.op("Pad", [x], out, pads=list(pads))

    def shape(self, x: ir.Value, start: int | None = None, end: int | None = None) -> ir.Value:
        """``Shape(x)[start:end]`` (int64 1-D), with ``Shape``'s own slicing from opset 15."""
        if start is None and end is None:
            return self.op("Shape", [x])
        if self.opset >= 15:
            return self.op("Shape", [x], start=start or 0, end=end)
        return self.slice(
            self.op("Shape", [x]), [start or 0], [INT64_MAX if end is None else end], [0]
        )

    def dim(self, x: ir.Value, axis: int) -> ir.Value:
        """``Shape(x)[axis]`` as an int64 ``[1]`` (``axis`` may be negative)."""
        return self.op("Gather", [self.op("Shape", [x]), self.ints([axis])], axis=0)

    def cast(
        self, x: ir.Value, to: int | ir.DataType, out: str | ir.Value | None = None
    ) -> ir.Value:
        return self.op("Cast", [x], out, to=int(to))

    def reshape(
        self, x: ir.Value, shape: ir.Value | Sequence[int], out: str | ir.Value | None = None
    ) -> ir.Value:
        target = shape if isinstance(shape, ir.Value) else self.ints(list(shape))
        return self.op("Reshape", [x, target], out)

    def concat(
        self, parts: Sequence[ir.Value], axis: int = 0, out: str | ir.Value | None = None
    ) -> ir.Value:
        return self.op("Concat", list(parts), out, axis=axis)

    def index_range(self, start: ir.Value, limit: ir.Value, delta: ir.Value) -> ir.Value:
        """``Range(start, limit, delta)`` to be used as ``Gather`` indices.

        An ``Abs`` (the indices are not negative) sits between them: ONNX Runtime's
        GatherToSliceFusion turns ``Gather(x, Range(...))`` into a ``Slice`` that reads
        a limit of -1 as "the last element", so a descending range to -1 (a flip) would
        select nothing; its NoopElimination removes an ``Add`` of 0.
        """
        return self.op("Abs", [self.op("Range", [start, limit, delta])])
