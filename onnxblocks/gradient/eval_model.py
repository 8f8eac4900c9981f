"""The eval model: the forward graph with its training-mode behaviour switched off.

Exporters in training mode emit ``Dropout`` with a ``training_mode`` input set to
true and ``BatchNormalization`` with ``training_mode=1`` and three outputs
(``Y``, ``running_mean``, ``running_var``). In the eval model:

* ``Dropout``'s ``training_mode`` input becomes an empty name (it then passes its
  input through), as the reference does: the slot stays, so code that reads
  ``node.input[2]`` (ONNX Runtime's own onnxblock tests do) finds ``""``;
* ``BatchNormalization`` gets ``training_mode=0`` and keeps only ``Y``: ONNX
  Runtime refuses a BatchNormalization with ``training_mode=0`` and more than one
  output. If something reads the running-statistics outputs, it reads the
  running-statistics *inputs* instead (in eval mode they are not updated).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from onnxblocks._core.naming import NameAuthority
from onnxblocks.ir.attributes import int_attribute
from onnxblocks.ir.folding import ConstantTable
from onnxblocks.ir.names import graph_names
from onnxblocks.ir.passes import Pass
from onnxblocks.ir.rewrite import is_default_domain, optional_input


class DisableTrainingMode(Pass):
    """Switch Dropout and BatchNormalization to inference behaviour.

    A ``Constant`` training flag nothing reads any more is removed.
    """

    name = "disable_training_mode"
    op_types = frozenset({"Dropout", "BatchNormalization"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        changes: dict[str, int] = {}
        names: list[NameAuthority] = []  # made on first use
        for node in list(graph):
            if not is_default_domain(node):
                continue
            if node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2] is not None:
                flag = node.inputs[2]
                node.replace_input_with(2, None)
                producer = flag.producer()
                if (
                    producer is not None
                    and producer.op_type == "Constant"
                    and producer.graph is graph
                    and not flag.uses()
                    and not flag.is_graph_output()
                ):
                    graph.remove(producer, safe=True)
            elif node.op_type == "BatchNormalization" and (
                int_attribute(node, "training_mode", 0) or len(node.outputs) > 1
            ):
                node.attributes["training_mode"] = ir.AttrInt64("training_mode", 0)
                # outputs 1, 2 (running mean / var) come from inputs 3, 4 when nothing is updated
                for out_index, in_index in ((1, 3), (2, 4)):
                    if out_index < len(node.outputs):
                        _read_input_instead(
                            graph, node, node.outputs[out_index], node.inputs[in_index], names
                        )
                node.resize_outputs(1)
            else:
                continue
            changes[node.op_type] = changes.get(node.op_type, 0) + 1
        return changes


class InferenceDropoutAsIdentity(Pass):
    """Make an inference-mode ``Dropout`` pass its input on, so that its gradient is ``dY``.

    ONNX Runtime's ``DropoutGrad`` ignores ``training_mode`` and scales ``dY`` by
    ``1 / (1 - ratio)`` (ratio 0.5 when none is given), whereas inference Dropout is the
    identity. A Dropout without a training flag, or with a constant false one, is read as
    an ``Identity`` of its input (the node stays only while its mask is read). A run-time
    flag gates the ratio instead, ``Where(flag, ratio, 0)``: at ratio 0 the Dropout and
    its gradient are identities in either mode.
    """

    name = "inference_dropout_as_identity"
    op_types = frozenset({"Dropout"})

    def apply(self, model: ir.Model) -> Mapping[str, int]:
        graph = model.graph
        constants: ConstantTable | None = None
        names: list[NameAuthority] = []
        count = 0
        for node in list(graph):
            if node.op_type != "Dropout" or not is_default_domain(node):
                continue
            flag = optional_input(node, 2)
            if flag is not None:
                constants = constants or ConstantTable(graph)
                known = constants.value(flag)
                if known is None:
                    _gate_ratio(graph, node, flag, names)
                    count += 1
                    continue
                if bool(np.asarray(known).item()):
                    continue
            _read_input_instead(graph, node, node.outputs[0], node.inputs[0], names)
            mask = node.outputs[1] if len(node.outputs) > 1 else None
            if mask is None or (not mask.uses() and not mask.is_graph_output()):
                graph.remove(node, safe=True)
            elif not node.outputs[
                0
            ].name:  # kept for its mask (all true): the output nothing reads needs a name
                names = names or [graph_names(graph)]
                node.outputs[0].name = names[0].fresh("dropout_unread")
            count += 1
        return {"Dropout": count} if count else {}


def _gate_ratio(graph: ir.Graph, node: ir.Node, flag: ir.Value, names: list[NameAuthority]) -> None:
    """Feed ``node`` the ratio ``Where(flag, ratio, ratio - ratio)`` (ratio 0.5 when it has
    none).
    """
    if not names:
        names.append(graph_names(graph))
    ratio = optional_input(node, 1)
    if ratio is None:
        half = ir.Node(
            "", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(np.float32(0.5)))]
        )
        half.outputs[0].name = names[0].fresh("dropout_ratio")
        graph.insert_before(node, half)
        ratio = half.outputs[0]
    zero = ir.Node("", "Sub", [ratio, ratio], name=names[0].fresh("Sub"))
    zero.outputs[0].name = names[0].fresh("dropout_ratio_zero")
    gated = ir.Node("", "Where", [flag, ratio, zero.outputs[0]], name=names[0].fresh("Where"))
    gated.outputs[0].name = names[0].fresh("dropout_ratio_gated")
    graph.insert_before(node, [zero, gated])
    node.replace_input_with(1, gated.outputs[0])


def _read_input_instead(
    graph: ir.Graph,
    node: ir.Node,
    output: ir.Value,
    source: ir.Value | None,
    names: list[NameAuthority],
) -> None:
    """Have whatever reads ``output`` read an ``Identity`` of ``source``, written after ``node``,
    instead.
    """
    if not output.uses() and not output.is_graph_output():
        return
    if not names:
        names.append(graph_names(graph))
    copy = ir.Node("", "Identity", [source], name=names[0].fresh("Identity"))
    graph.insert_after(node, copy)
    ir.convenience.replace_all_uses_with(output, copy.outputs[0], replace_graph_outputs=True)
    copy.outputs[0].name, output.name = output.name, None
