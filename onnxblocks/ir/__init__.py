"""The one graph IR under every graph edit onnxblocks makes.

onnxblocks edits graphs in one in-memory form, `onnx-ir <https://github.com/onnx/ir-py>`_
(``import onnx_ir as ir``): values with def-use chains, nodes in a linked list,
recursive iteration, lazy external tensors, and protobuf serde. This package holds
what every editing package shares, so no other package walks, rebuilds, names or
prunes a graph by hand:

* :mod:`~onnxblocks.ir.serde`: ``ModelProto`` <-> ``ir.Model`` at the boundaries
  (held weight stubs stay stubs; no tensor is copied);
* :mod:`~onnxblocks.ir.wellformed`: a user's model checked for values defined twice or
  never, naming them (on the protobuf, before anything reads it);
* :mod:`~onnxblocks.ir.passes`: the one pass contract (:class:`Pass`, returning a
  :class:`PassResult` that says what changed) and :func:`run_passes`;
* :mod:`~onnxblocks.ir.walk`: recursive iteration over nodes and the values subgraphs read
  (and :func:`~onnxblocks.ir.walk.proto_nodes`, a read-only walk of a ``GraphProto``);
* :mod:`~onnxblocks.ir.edit`: graph surgery (dead-node removal, cutting a graph down to
  some outputs, renaming values, replacing a node by others);
* :mod:`~onnxblocks.ir.names`: the graph's name authority (names derived from the
  graph, never from a process-wide counter; a user's name is never changed), for an
  ``ir.Graph`` or a ``GraphProto``;
* :mod:`~onnxblocks.ir.opset`: converting a model's ai.onnx opset (onnx's version
  converter), naming the ops, subgraphs included, that block it;
* :mod:`~onnxblocks.ir.writer`: :class:`Writer`, which builds the nodes of one rewrite
  with fresh names and the opset-dependent forms of ops (``Squeeze``, ``Reduce*``,
  ``Split``, ``Pad``...) spelled once;
* :mod:`~onnxblocks.ir.proto`: the input/output/initializer list edits of the protobuf
  graphs handed to and taken back from ONNX Runtime's gradient builder;
* :mod:`~onnxblocks.ir.types`, :mod:`~onnxblocks.ir.attributes`, :mod:`~onnxblocks.ir.folding`:
  what passes read (inferred types per value, typed attributes, constant folding);
* :mod:`~onnxblocks.ir.lazy`: onnx-ir's sympy is imported only when symbolic dims are
  computed with (it would add ~0.2 s to every build).

The IR is imported only by the packages that edit graphs (gradient, portable,
artifacts, torch, and the runtime when it exports), never by ``import onnxblocks``.
"""
