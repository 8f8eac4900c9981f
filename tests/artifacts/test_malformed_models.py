"""Models that break ONNX's single-definition rule are refused naming the value, the node and the file.

The family (each in the main graph, in an ``If`` branch, and where it applies in a model-local
function): a value defined twice (two nodes, a node and a graph input or initializer, one node
listing an output twice), a graph input or initializer listed twice, a node reading a value
nothing defines, a graph output nothing defines. Each is refused by ``generate_artifacts`` (from
a ModelProto and from a file) and by ``onnxblocks.base`` with an ``InvalidValueError``; every other
way in that reads a model into the IR (``apply_lora`` here) refuses a value defined twice with
one too, never onnx-ir's ``SerdeError``. Models that only look alike are accepted: a subgraph
shadowing an outer name, an initializer that is also a graph input, nodes out of order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import onnx
import pytest
from onnx import TensorProto, helper
from support.onnx_models import make_linear_model

import onnxblocks
from onnxblocks import LossType, generate_artifacts
from onnxblocks.errors import InvalidValueError, OnnxBlocksError
from onnxblocks.ir import serde, wellformed
from onnxblocks.peft import LoraConfig, apply_lora

Edit = Callable[[onnx.GraphProto], None]


def _insert(index: int, node: onnx.NodeProto) -> Edit:
    return lambda graph: graph.node.insert(index, node)


def _rename_input(node: int, slot: int, name: str) -> Edit:
    return lambda graph: graph.node[node].input.__setitem__(slot, name)


#: case -> (the edit of a linear graph ``x -> MatMul(W) -> xw -> Add(b) -> y``, what the message names)
CASES: dict[str, tuple[Edit, list[str]]] = {
    "value-defined-by-two-nodes": (
        _insert(1, helper.make_node("Relu", ["x"], ["xw"], name="second_def")),
        ["'xw'", "defined twice", "node #0 (MatMul)", "node 'second_def' (Relu)"],
    ),
    "node-output-redefines-a-graph-input": (
        _insert(0, helper.make_node("Relu", ["W"], ["x"], name="redef_x")),
        ["'x'", "defined twice", "graph input", "node 'redef_x' (Relu)"],
    ),
    "node-output-redefines-an-initializer": (
        _insert(0, helper.make_node("Relu", ["x"], ["W"], name="redef_W")),
        ["'W'", "defined twice", "initializer", "node 'redef_W' (Relu)"],
    ),
    "one-node-lists-an-output-twice": (
        lambda graph: graph.node[0].output.append("xw"),
        ["'xw'", "defined twice", "node #0 (MatMul)"],
    ),
    "graph-input-listed-twice": (
        lambda graph: graph.input.append(copy.deepcopy(graph.input[0])),
        ["graph input 'x'", "listed twice"],
    ),
    "initializer-listed-twice": (
        lambda graph: graph.initializer.append(copy.deepcopy(graph.initializer[0])),
        ["initializer 'W'", "listed twice"],
    ),
    "node-reads-an-undefined-value": (
        _rename_input(1, 1, "ghost"),
        ["node #1 (Add)", "'ghost'", "nothing defines"],
    ),
    "graph-output-undefined": (
        lambda graph: graph.output.append(
            helper.make_tensor_value_info("nowhere", TensorProto.FLOAT, [1])
        ),
        ["graph output 'nowhere'", "defined by no node"],
    ),
}


def _model(edit: Edit) -> onnx.ModelProto:
    model = make_linear_model()
    edit(model.graph)
    return model


def _refused(call: Callable[[], object], named: list[str]) -> str:
    with pytest.raises(InvalidValueError) as info:
        call()
    message = str(info.value)
    for part in named:
        assert part in message, (part, message)
    assert "re-export" in message  # says what to do
    return message


@pytest.mark.parametrize("case", sorted(CASES))
def test_generate_artifacts_names_the_offender_and_the_file(tmp_path, case):
    edit, named = CASES[case]
    model = _model(edit)
    path = tmp_path / f"{case}.onnx"
    onnx.save(model, path)
    config = {"requires_grad": ["W"], "loss": LossType.MSELoss}
    _refused(lambda: generate_artifacts(model, artifact_directory=tmp_path / "a", **config), named)
    message = _refused(
        lambda: generate_artifacts(path, artifact_directory=tmp_path / "b", **config), named
    )
    assert f"'{path}'" in message
    _refused(lambda: onnxblocks.base(model).__enter__(), named)  # the block API's way in, too
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _if_model(branch_edit: Edit) -> onnx.ModelProto:
    """``y = If(c, then: Relu(x), else: Neg(x))``, the then-branch edited by ``branch_edit``."""
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"], name="then_relu")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    branch_edit(then)
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then, else_branch=other)],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SUBGRAPH_CASES: dict[str, tuple[Edit, list[str]]] = {
    "value-defined-twice-in-a-branch": (
        _insert(1, helper.make_node("Abs", ["x"], ["t"], name="again")),
        [
            "'t'",
            "defined twice",
            "node 'again' (Abs) in the subgraph 'then_branch' of node 'choose' (If)",
        ],
    ),
    "branch-reads-an-undefined-value": (
        _rename_input(0, 0, "ghost"),
        ["node 'then_relu' (Relu) in the subgraph 'then_branch' of node 'choose' (If)", "'ghost'"],
    ),
    "branch-output-undefined": (
        lambda g: g.output.append(helper.make_tensor_value_info("nowhere", TensorProto.FLOAT, [2])),
        ["graph output 'nowhere' in the subgraph 'then_branch'"],
    ),
}


@pytest.mark.parametrize("case", sorted(SUBGRAPH_CASES))
def test_subgraphs_are_checked_with_their_scope(case):
    edit, named = SUBGRAPH_CASES[case]
    _refused(lambda: wellformed.check_model(_if_model(edit), "m.onnx"), [*named, "'m.onnx'"])


def test_function_bodies_are_checked():
    body = [
        helper.make_node("Relu", ["a"], ["r"], name="f_relu"),
        helper.make_node("Neg", ["a"], ["r"], name="f_neg"),
    ]
    function = helper.make_function(
        "custom", "Twice", ["a"], ["r"], body, [helper.make_opsetid("", 17)]
    )
    model = make_linear_model()
    model.functions.append(function)
    named = [
        "'r'",
        "defined twice",
        "node 'f_relu' (Relu) in function 'Twice'",
        "node 'f_neg' (Neg)",
    ]
    _refused(lambda: wellformed.check_model(model), named)


def test_every_reader_into_the_ir_refuses_with_an_onnxblocks_error():
    """Not onnx-ir's SerdeError: the one door (ir.serde) names the value and the node whoever calls it."""
    model = _model(CASES["value-defined-by-two-nodes"][0])
    named = ["'xw'", "node 'second_def' (Relu)"]
    _refused(lambda: serde.from_proto(model, "from_proto.onnx"), [*named, "'from_proto.onnx'"])
    _refused(lambda: serde.graph_from_proto(model.graph), named)
    with pytest.raises(OnnxBlocksError, match="'xw'"):
        apply_lora(model, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"))


def test_models_that_only_look_alike_are_accepted(tmp_path):
    shadowing = _if_model(
        _insert(0, helper.make_node("Relu", ["x"], ["y"], name="inner_y"))
    )  # y: outer name
    reordered = make_linear_model()
    reordered.graph.node.reverse()
    defaulted = make_linear_model()  # an initializer that is also a graph input: its default value
    defaulted.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [8, 4]))
    for model in (shadowing, reordered, defaulted):
        assert wellformed.problems(model) == []
    generate_artifacts(
        defaulted, artifact_directory=tmp_path, requires_grad=["W"], loss=LossType.MSELoss
    )
