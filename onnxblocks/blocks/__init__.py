"""Blocks: the model accessor, Block/ForwardBlock, and op blocks."""

import onnxblocks.ir.lazy  # noqa: F401  # first: onnx-ir's sympy loads only if computed with
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.block import Block, ForwardBlock
from onnxblocks.blocks.elementwise import (
    Abs,
    Add,
    Cast,
    Clip,
    Div,
    Exp,
    Log,
    Mul,
    Neg,
    Op,
    Pow,
    Sigmoid,
    Sqrt,
    Sub,
)
from onnxblocks.blocks.opening import (
    active,
    base,
    current,
    custom_op_libraries,
    custom_op_library,
    empty_base,
)
from onnxblocks.blocks.reductions import ReduceAllL2, ReduceMean, ReduceSum
from onnxblocks.blocks.script import ScriptBlock, from_onnxscript
from onnxblocks.blocks.structural import (
    Constant,
    InputLike,
    LabelEncoder,
    Linear,
    PassThrough,
    SequenceConstruct,
)
from onnxblocks.blocks.training import TrainingBlock
from onnxblocks.blocks.value import Value, value

__all__ = [
    "Abs",
    "Add",
    "Block",
    "Cast",
    "Clip",
    "Constant",
    "Div",
    "Exp",
    "ForwardBlock",
    "InputLike",
    "LabelEncoder",
    "Linear",
    "Log",
    "ModelAccessor",
    "Mul",
    "Neg",
    "Op",
    "PassThrough",
    "Pow",
    "ReduceAllL2",
    "ReduceMean",
    "ReduceSum",
    "ScriptBlock",
    "SequenceConstruct",
    "Sigmoid",
    "Sqrt",
    "Sub",
    "TrainingBlock",
    "Value",
    "active",
    "base",
    "current",
    "custom_op_libraries",
    "custom_op_library",
    "empty_base",
    "from_onnxscript",
    "value",
]
