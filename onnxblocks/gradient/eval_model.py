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

import onnx
from onnx import helper

from onnxblocks.gradient import _graph


def disable_training_mode(model: onnx.ModelProto) -> int:
    """Switch Dropout and BatchNormalization to inference behaviour, in place.

    Returns:
        The number of nodes changed.
    """
    graph = model.graph
    names = _graph.name_authority(graph)
    readers = _graph.consumers(graph)
    outputs = {o.name for o in graph.output}
    changed = 0
    new_nodes: list[onnx.NodeProto] = []
    orphaned: set[str] = set()  # training_mode values nothing reads any more
    for node in graph.node:
        new_nodes.append(node)
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            flag = node.input[2]
            node.input[2] = ""
            readers[flag] = [r for r in readers[flag] if r is not node]
            if not readers[flag] and flag not in outputs:
                orphaned.add(flag)
            changed += 1
        elif node.op_type == "BatchNormalization" and (
            _graph.attribute(node, "training_mode", 0) or len(node.output) > 1
        ):
            _graph.set_attribute(node, "training_mode", 0)
            # outputs 1, 2 (running mean / var) come from inputs 3, 4 when nothing is updated
            for out_index, in_index in ((1, 3), (2, 4)):
                if out_index < len(node.output) and node.output[out_index]:
                    name = node.output[out_index]
                    if readers.get(name) or name in outputs:
                        new_nodes.append(
                            helper.make_node("Identity", [node.input[in_index]], [name], name=names.fresh("Identity"))
                        )
            del node.output[1:]
            changed += 1
    if changed:
        kept = [n for n in new_nodes if not (n.op_type == "Constant" and n.output and n.output[0] in orphaned)]
        del graph.node[:]
        graph.node.extend(kept)
    return changed
