"""A large quantized table read a chunk of rows at a time, never dequantized whole.

A tied embedding (``[V, H]``, blocks along ``H``) is read by the embedding's ``Gather`` and by
the LM head (``Gemm(x, W, transB=1)``, ``MatMul(x, Transpose(W))``, and, in the lean loss's
gradient, ``MatMul(g, W)``). Dequantized whole it is a float32 copy of the size of the float base's
biggest weight (108 MiB for SmolLM2-135M). Each reader here instead dequantizes chunks of rows
(views of the same bytes in the base file: rows of a blocked int8/int4 tensor are contiguous, and
so are their scales), one after the other: each chunk's ``DequantizeLinear`` waits for the
previous chunk's result, so one or two chunks are alive at a time.

* ``Gather(W, ids, axis=0)``: each chunk gathers the ids that fall in it; ``Where`` keeps them.
  Exactly the rows the whole table gives.
* ``Gemm(x, W, transB=1)`` / ``MatMul(x, Transpose(W))``: the chunks' columns, concatenated.
* ``MatMul(g, W)``: the sum of each chunk's ``MatMul(g[..., rows], W_rows)``; the sum over the
  vocabulary is split in ``len(chunks)`` parts, so it may differ from the whole product in the
  last bits.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

from onnxblocks._core.naming import NameAuthority
from onnxblocks._core.weights import HELD_LOCATION_PREFIX, TensorSource, WeightStore
from onnxblocks.ir.dequantize import delayed_dequantize

__all__ = [
    "CHUNK_BYTES",
    "MIN_BYTES",
    "View",
    "place_views",
    "read_in_row_chunks",
    "views_in_store",
]

#: Float32 bytes of one dequantized chunk of rows.
CHUNK_BYTES = 8 << 20
#: Tables whose float32 copy is smaller are dequantized whole, as other weights.
MIN_BYTES = 32 << 20

#: ``chunk name -> (parent name, byte offset in the parent, byte length, first row, end row)``.
View = tuple[str, int, int, int, int]

_BITS = {ir.DataType.INT4: 4, ir.DataType.UINT4: 4, ir.DataType.INT8: 8, ir.DataType.UINT8: 8}


def _spans(rows: int, width: int) -> list[tuple[int, int]]:
    step = max(1, CHUNK_BYTES // (4 * width))
    step = step // 256 * 256 if step > 256 else step
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def _eligible(value: ir.Value, kind: ir.DataType, scale: ir.Value, block: int) -> bool:
    shape = value.shape
    if shape is None or len(shape) != 2 or kind not in _BITS or not block:
        return False
    rows, width = shape
    if not (isinstance(rows, int) and isinstance(width, int)) or scale.shape is None:
        return False
    whole = (width * _BITS[kind]) % 8 == 0 and rows * width * 4 >= MIN_BYTES
    return whole and len(_spans(rows, width)) > 1


class _Chunks:
    """The chunk views of one table and the nodes that read them."""

    def __init__(
        self,
        main: ir.Graph,
        value: ir.Value,
        kind: ir.DataType,
        scale: ir.Value,
        block: int,
        names: NameAuthority,
        views: dict[str, View],
        to: ir.DataType,
    ) -> None:
        self.main, self.value, self.scale, self.block = main, value, scale, block
        self.kind = kind
        self.names, self.views, self.to = names, views, to
        assert value.shape is not None
        rows, width = (int(d) for d in value.shape.numpy())  # static: checked by _eligible
        self.rows, self.width, self.spans = rows, width, _spans(rows, width)
        self.made: dict[tuple[int, int], tuple[ir.Value, ir.Value]] = {}
        self.nodes: list[ir.Node] = []
        self.graph = main

    def node(self, op: str, inputs: list[ir.Value], **attributes: object) -> ir.Node:
        attrs = [
            ir.AttrInt64s(k, v) if isinstance(v, list) else ir.AttrInt64(k, v)  # type: ignore[arg-type]
            for k, v in attributes.items()
        ]
        hint = f"{self.value.name}.rows_{op.lower()}"
        made = ir.Node("", op, inputs, attributes=attrs, name=self.names.fresh(hint))
        made.outputs[0].name = self.names.fresh(f"{hint}_out")
        self.nodes.append(made)
        return made

    def out(self, op: str, inputs: list[ir.Value], **attributes: object) -> ir.Value:
        return self.node(op, inputs, **attributes).outputs[0]

    def const(self, values: object, dtype: type = np.int64) -> ir.Value:
        name = self.names.fresh(f"{self.value.name}.rows_const")
        made = ir.Value(name=name, const_value=ir.tensor(np.asarray(values, dtype), name=name))
        self.graph.register_initializer(made)
        return made

    def _view(self, of: ir.Value, kind: ir.DataType, span: tuple[int, int]) -> ir.Value:
        a, b = span
        assert of.shape is not None
        tail = tuple(int(d) for d in of.shape.numpy()[1:])
        name = f"{of.name}.rows{a}_{b}"
        per_row = int(np.prod(tail)) * _BITS.get(kind, 32) // 8
        assert of.name is not None
        shape = ir.Shape((b - a, *tail))
        tensor = ir.ExternalTensor(
            HELD_LOCATION_PREFIX + name, None, None, kind, shape=shape, name=name
        )
        made = ir.Value(name=name, const_value=tensor)
        made.dtype, made.shape = kind, shape
        if name not in self.main.initializers:
            self.main.register_initializer(made)
        self.views[name] = (of.name, a * per_row, (b - a) * per_row, a, b)
        return self.main.initializers[name]

    def table(self, span: tuple[int, int], trigger: ir.Value | None) -> ir.Value:
        """The float rows of ``span``, dequantized once ``trigger`` exists."""
        if span not in self.made:
            self.made[span] = (
                self._view(self.value, self.kind, span),
                self._view(self.scale, ir.DataType.FLOAT, span),
            )
        q, scale = self.made[span]
        nodes = delayed_dequantize(
            self.graph,
            q,
            self.to,
            trigger,
            (scale, self.block),
            lambda op, inputs, **a: self.node(op, list(inputs), **a),
            self.names,
            f"{self.value.name}.rows",
        )
        return nodes[-1].outputs[0]

    def gather(self, ids: ir.Value) -> ir.Value:
        zero_id = self.const(0)
        fixed = self.out(
            "Where",
            [self.out("Less", [ids, zero_id]), self.out("Add", [ids, self.const(self.rows)]), ids],
        )
        result: ir.Value | None = None
        for a, b in self.spans:
            inside = self.out(
                "And",
                [
                    self.out("GreaterOrEqual", [fixed, self.const(a)]),
                    self.out("Less", [fixed, self.const(b)]),
                ],
            )
            local = self.out("Where", [inside, self.out("Sub", [fixed, self.const(a)]), zero_id])
            rows = self.out(
                "Gather", [self.table((a, b), ids if result is None else result), local], axis=0
            )
            keep = self.out("Unsqueeze", [inside, self.const([-1])])
            other = result if result is not None else self.const(0.0, np.float32)
            result = self.out("Where", [keep, rows, other])
        assert result is not None
        return result

    def columns(self, x: ir.Value, op: str) -> ir.Value:
        """``x @ W^T`` by chunks of ``W``'s rows (``op``: ``Gemm`` with ``transB`` or
        ``MatMul`` of the transposed chunk).
        """
        parts: list[ir.Value] = []
        for span in self.spans:
            table = self.table(span, parts[-1] if parts else x)
            if op == "Gemm":
                parts.append(self.out("Gemm", [x, table], transB=1))
            else:
                parts.append(self.out("MatMul", [x, self.out("Transpose", [table], perm=[1, 0])]))
        return self.out("Concat", parts, axis=-1)

    def contract(self, g: ir.Value) -> ir.Value:
        """``g @ W`` (``g``: ``[..., V]``) as the sum of the chunks' products."""
        total: ir.Value | None = None
        last = self.const([-1])
        for a, b in self.spans:
            part = self.out("Slice", [g, self.const([a]), self.const([b]), last])
            product = self.out("MatMul", [part, self.table((a, b), g if total is None else total)])
            total = product if total is None else self.out("Add", [total, product])
        assert total is not None
        return total


def read_in_row_chunks(
    main: ir.Graph,
    value: ir.Value,
    kind: ir.DataType,
    scale: ir.Value,
    block: int,
    names: NameAuthority,
    views: dict[str, View],
) -> set[ir.Node]:
    """Rewrite the readers of the quantized table ``value`` (scales ``scale``, blocks of ``block``
    along its rows) that read it by rows, in any graph of ``main``; return the readers rewritten
    (now gone from their graphs; other readers are left for the caller). ``kind`` is the element
    type ``value`` is stored as; ``views`` receives the chunk initializers made.
    """
    done: set[ir.Node] = set()
    if not _eligible(value, kind, scale, block):
        return done
    for user, index in list(value.uses()):
        if user in done or user.domain not in ("", "ai.onnx"):
            continue
        graph = user.graph
        assert graph is not None
        attrs = {k: a.value for k, a in user.attributes.items()}
        chunks = _Chunks(main, value, kind, scale, block, names, views, ir.DataType.FLOAT)
        chunks.graph = graph
        if user.op_type == "Gather" and index == 0 and attrs.get("axis", 0) == 0:
            result = chunks.gather(user.inputs[1])  # type: ignore[arg-type]
        elif user.op_type == "Gemm" and index == 1 and _plain(attrs, transB=1):
            if len(user.inputs) > 2 and user.inputs[2] is not None:
                continue
            result = chunks.columns(user.inputs[0], "Gemm")  # type: ignore[arg-type]
        elif user.op_type == "MatMul" and index == 1 and user.inputs[0] is not value:
            result = chunks.contract(user.inputs[0])  # type: ignore[arg-type]
        elif user.op_type == "Transpose" and list(attrs.get("perm", [1, 0])) == [1, 0]:
            readers = list(user.outputs[0].uses())
            kinds = [_transposed_reader(r, i, user.outputs[0]) for r, i in readers]
            if not readers or user.outputs[0].is_graph_output() or None in kinds:
                continue
            for (reader, _), how in zip(readers, kinds, strict=True):
                each = _Chunks(main, value, kind, scale, block, names, views, ir.DataType.FLOAT)
                each.graph = reader.graph  # type: ignore[assignment]
                x = reader.inputs[0]
                assert x is not None
                out = each.columns(x, "MatMul") if how == "columns" else each.contract(x)
                _replace(reader, each.nodes, out)
            user.graph.remove(user, safe=True)  # type: ignore[union-attr]
            done.add(user)
            continue
        else:
            continue
        _replace(user, chunks.nodes, result)
        done.add(user)
    return done


def _transposed_reader(reader: ir.Node, index: int, moved: ir.Value) -> str | None:
    """How ``reader`` uses ``W^T`` (``moved``): ``x @ W^T`` ("columns"), ``x @ W`` through the
    gradient builder's ``FusedMatMul(x, W^T, transB=1)`` ("contract"), or None (another use).
    """
    if index != 1 or reader.inputs[0] is moved:
        return None
    attrs = {k: a.value for k, a in reader.attributes.items()}
    if reader.op_type == "MatMul" and reader.domain in ("", "ai.onnx"):
        return "columns"
    if reader.op_type == "FusedMatMul" and reader.domain == "com.microsoft":
        if _plain(attrs, transB=1):
            return "contract"
    return None


def _plain(attrs: dict[str, object], **wanted: int) -> bool:
    """Attributes of a Gemm or FusedMatMul: ``wanted``, the others at their defaults."""
    defaults = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
    defaults |= {"transBatchA": 0, "transBatchB": 0, **wanted}
    return set(attrs) <= set(defaults) and all(attrs.get(k, v) == v for k, v in defaults.items())


def _replace(user: ir.Node, nodes: list[ir.Node], result: ir.Value) -> None:
    graph = user.graph
    assert graph is not None
    graph.insert_before(user, nodes)
    old = user.outputs[0]
    result.dtype, result.shape = old.dtype or ir.DataType.FLOAT, old.shape  # float rows
    was_output = old.is_graph_output()
    old.replace_all_uses_with(result)
    if was_output:
        outputs = graph.outputs
        outputs[outputs.index(old)] = result
        result.name, old.name = old.name, None
    graph.remove(user, safe=True)


def place_views(
    views: dict[str, View], shared: dict[str, tuple[str, int, int]]
) -> dict[str, tuple[str, int, int]]:
    """``shared`` (references ``name -> (file, offset, length)``) with each view of a table there
    placed inside the table's bytes.
    """
    placed = dict(shared)
    for name, (table, offset, length, _, _) in views.items():
        if table not in shared:
            continue
        where, start, size = shared[table]
        assert offset + length <= size, f"view {name!r} runs past {table!r}"
        placed[name] = (where, start + offset, length)
    return placed


def views_in_store(views: dict[str, View], store: WeightStore, threshold: int) -> None:
    """Add to ``store`` each view of a table smaller than ``threshold`` bytes (kept out of the
    base file, so the view's rows are written themselves).
    """
    for name, (table, _, _, first, end) in views.items():
        parent = store.source(table)
        if parent.nbytes < threshold:
            dims = (end - first, *parent.dims[1:])
            rows = functools.partial(_rows, parent, first, end)
            store.add(TensorSource(name, parent.data_type, dims, load=rows))


def _rows(source: TensorSource, first: int, end: int) -> np.ndarray:
    return source.array()[first:end]
