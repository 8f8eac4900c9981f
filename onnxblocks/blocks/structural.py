"""Structural blocks: Constant, SequenceConstruct, PassThrough, InputLike, LabelEncoder, Linear."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from onnxblocks._core.errors import InvalidValueError, UnknownNameError, did_you_mean, preview
from onnxblocks.blocks.block import Block
from onnxblocks.blocks.value import Value


class Constant(Block):
    """A float32 constant of shape ``[1]`` (the reference's contract); see also
    ``accessor.constant``.
    """

    def __init__(self, value_float: float) -> None:
        super().__init__()
        self._value = value_float

    def build(self) -> Value:
        """Add the constant and return its name."""
        return self.accessor.constant(
            np.array([self._value], dtype=np.float32), name_hint="constant"
        )


class SequenceConstruct(Block):
    """Pack tensors into a sequence."""

    def build(self, *sequence_input_names: str) -> Value:
        """Return a sequence of ``sequence_input_names``."""
        acc = self.accessor
        types = [acc.type_of(n) for n in sequence_input_names]
        out_types = None
        if types and types[0] is not None and types[0].WhichOneof("value") == "tensor_type":
            seq = onnx.TypeProto()
            seq.sequence_type.elem_type.tensor_type.elem_type = types[0].tensor_type.elem_type
            out_types = [seq]
        return acc.op("SequenceConstruct", list(sequence_input_names), output_types=out_types)


class PassThrough(Block):
    """Return its inputs unchanged (the "no loss" block)."""

    def build(self, *input_names: str) -> tuple[str, ...]:
        """Return ``input_names`` after checking that each exists."""
        for n in input_names:
            self.accessor.require(n)
        return tuple(input_names)


class InputLike(Block):
    """Add a graph input with the type and shape of an existing input or output.

    Args:
        like: The graph input or output to copy the type from.
    """

    def __init__(self, like: str) -> None:
        super().__init__()
        self._like = like

    def build(self, input_name: str | None = None) -> Value:
        """Add the input as ``input_name`` (a fresh name when None) and return it."""
        acc = self.accessor
        known = acc.input_names() + acc.output_names()
        if self._like not in known:
            raise UnknownNameError(
                f"InputLike: '{self._like}' is not a graph input or "
                f"output.{did_you_mean(self._like, known)} "
                f"Inputs and outputs: {preview(known)}."
            )
        name = input_name or acc.names.fresh("input")
        if acc.has_value(name):
            return acc.add_input(name, 0, None)  # reuses an existing input or raises
        clone = onnx.ValueInfoProto(name=name)
        declared = acc.declared_type(self._like)
        if declared is not None:
            clone.type.CopyFrom(declared)
        return acc.add_typed_input(clone)


class LabelEncoder(Block):
    """Map keys to values with ``ai.onnx.ml.LabelEncoder`` (e.g. strings to class ids)."""

    def __init__(
        self,
        default_float: float = 0.0,
        default_int64: int = -1,
        default_string: str = "_Unused",
        keys_floats: list[float] | None = None,
        keys_int64s: list[int] | None = None,
        keys_strings: list[str] | None = None,
        values_floats: list[float] | None = None,
        values_int64s: list[int] | None = None,
        values_strings: list[str] | None = None,
    ) -> None:
        super().__init__()
        self._attributes: dict[str, Any] = {
            "default_float": default_float,
            "default_int64": default_int64,
            "default_string": default_string,
            "keys_floats": keys_floats,
            "keys_int64s": keys_int64s,
            "keys_strings": keys_strings,
            "values_floats": values_floats,
            "values_int64s": values_int64s,
            "values_strings": values_strings,
        }
        keys = [
            k
            for k in ("keys_floats", "keys_int64s", "keys_strings")
            if self._attributes[k] is not None
        ]
        vals = [
            k
            for k in ("values_floats", "values_int64s", "values_strings")
            if self._attributes[k] is not None
        ]
        if len(keys) != 1 or len(vals) != 1:
            raise InvalidValueError(
                "LabelEncoder needs exactly one of keys_floats/keys_int64s/keys_strings and one of "
                f"values_floats/values_int64s/values_strings; got keys {keys} and values {vals}."
            )
        if len(self._attributes[keys[0]]) != len(self._attributes[vals[0]]):
            raise InvalidValueError(
                f"LabelEncoder: {keys[0]} and {vals[0]} must have the same length."
            )

    def build(self, label_encoder_input_name: str) -> Value:
        """Encode ``label_encoder_input_name``."""
        acc = self.accessor
        value_kind = next(
            k for k in ("values_floats", "values_int64s", "values_strings") if self._attributes[k]
        )
        elem = {
            "values_floats": onnx.TensorProto.FLOAT,
            "values_int64s": onnx.TensorProto.INT64,
            "values_strings": onnx.TensorProto.STRING,
        }[value_kind]
        shape = acc.shape_of(label_encoder_input_name)
        return acc.op(
            "LabelEncoder",
            [label_encoder_input_name],
            domain="ai.onnx.ml",
            output_types=[onnx.helper.make_tensor_type_proto(elem, shape)],
            **self._attributes,
        )


class Linear(Block):
    """A fully connected layer ``x @ W + b`` (Gemm) with new, randomly initialised parameters.

    Args:
        in_features: Size of the last input dimension.
        out_features: Size of the output.
        bias: Whether to add a bias.
        alpha, beta: Gemm's scales of ``x @ W`` and of ``b``.
        seed: Seed of the initialisation (None: numpy's global random state).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        alpha: float = 1.0,
        beta: float = 1.0,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self._in_features = in_features
        self._out_features = out_features
        self._bias = bias
        self._alpha = alpha
        self._beta = beta
        self._seed = seed

    def build(self, linear_input_name: str) -> Value:
        """Apply the layer to ``linear_input_name`` and return its output."""
        acc = self.accessor
        acc.require(linear_input_name)
        rng = np.random.default_rng(self._seed) if self._seed is not None else np.random
        bound = 1.0 / np.sqrt(self._in_features)
        weight_name = acc.names.fresh("linear.weight")
        weight = rng.uniform(-bound, bound, (self._in_features, self._out_features)).astype(
            np.float32
        )
        acc.add_initializer(weight_name, weight)
        inputs = [linear_input_name, weight_name]
        if self._bias:
            bias_name = acc.names.fresh("linear.bias")
            bias = rng.uniform(-bound, bound, (self._out_features,)).astype(np.float32)
            acc.add_initializer(bias_name, bias)
            inputs.append(bias_name)
        return acc.op("Gemm", inputs, alpha=self._alpha, beta=self._beta)
