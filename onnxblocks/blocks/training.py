"""TrainingBlock: a block whose first output is a loss to differentiate.

Calling a TrainingBlock builds its nodes like any block, then builds the
gradient graph with ONNX Runtime (see :mod:`onnxblocks.gradient`). Afterwards
:meth:`TrainingBlock.to_model_proto` gives the training and eval models and
:meth:`TrainingBlock.parameters` the trainable and frozen parameters for the
checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

from onnxblocks._core import weights as _weights
from onnxblocks._core.errors import InvalidTypeError, NotBuiltError
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.block import Block, _BuildView

if TYPE_CHECKING:
    from onnxblocks.gradient import TrainingGraphs


class TrainingBlock(Block):
    """Base class of blocks whose output is the loss that training minimises.

    ``build`` returns the loss (the value gradients start from), optionally
    followed by more outputs that the training and eval models also return.

    By default nothing requires a gradient; name the parameters (initializers)
    to train with :meth:`requires_grad`. A graph input may require a gradient
    too: the training model then outputs ``<input>_grad``.

    Example:
        >>> class MSETraining(onnxblocks.TrainingBlock):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.loss = onnxblocks.losses.MSELoss()
        ...     def build(self, output_name):
        ...         return self.loss(output_name)
        >>> block = MSETraining()
        >>> for name in ("fc1.weight", "fc1.bias"):
        ...     block.requires_grad(name)
        >>> with onnxblocks.base(model):
        ...     block("output")
        >>> training_model, eval_model = block.to_model_proto()
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._requires_grad_names: dict[str, None] = {}
        self._frozen_names: dict[str, None] = {}

    # ------------------------------------------------------------- configuration
    def _sets(self) -> tuple[dict[str, None], dict[str, None]]:
        # subclasses that skip super().__init__() still work
        if not hasattr(self, "_requires_grad_names"):
            self._requires_grad_names = {}
            self._frozen_names = {}
        return self._requires_grad_names, self._frozen_names

    def requires_grad(self, argument_name: str, value: bool = True) -> None:
        """Say whether a parameter (or graph input) gets a gradient.

        ``value=True`` makes a parameter trainable (or asks for ``<input>_grad``
        of a graph input); ``value=False`` freezes a parameter: it is still fed
        from the checkpoint but gets no gradient. Names are checked when the
        block is built.

        Raises:
            TypeError: if ``argument_name`` is not a string.
        """
        if not isinstance(argument_name, str):
            raise InvalidTypeError(
                f"requires_grad takes a parameter name (str), not {type(argument_name).__name__}."
            )
        trainable, frozen = self._sets()
        if value:
            trainable[argument_name] = None
            frozen.pop(argument_name, None)
        else:
            trainable.pop(argument_name, None)
            frozen[argument_name] = None

    def recompute(self, policy: str | int | Sequence[str]) -> None:
        """Say which forward segments the backward recomputes instead of keeping their activations.

        ``"none"`` (the default), ``"layers"`` (every repeated block: ``model.layers.N``,
        ``encoder.layer.N``, ``h.N``...), ``"auto"`` or a byte budget (the fewest blocks whose
        recomputation fits the estimated activations in the budget; ``"auto"``: a third of the
        weights' bytes) or a list of module paths (docs/training.md, "Recomputation"). Checked
        here; the segments are found when the block is built.

        Raises:
            TypeError: for a policy that is neither a str, an int nor a list of str.
            ValueError: for another string, a budget below 1 or an empty list.
        """
        from onnxblocks.gradient.recompute import check_recompute

        self._recompute_policy = check_recompute(policy)

    # ------------------------------------------------------------- building
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Build the loss, then the training and eval models; returns what ``build`` returned."""
        # a lower layer, loaded on first build (import time)
        from onnxblocks.gradient import build_training_graphs
        from onnxblocks.gradient.segments import module_scopes

        out = super().__call__(*args, **kwargs)
        names = [
            n for n in (list(out) if isinstance(out, (tuple, list)) else [out]) if n is not None
        ]
        acc: ModelAccessor = self._accessor
        acc.set_outputs(names)
        working = acc.ir_model  # cloned by the builder, which converts it at ONNX Runtime's door
        trainable, frozen = self._sets()
        policy = getattr(self, "_recompute_policy", "none")
        graphs = build_training_graphs(
            working,
            list(trainable),
            list(frozen),
            outputs=names,
            custom_op_libraries=acc.custom_op_libraries,
            recompute=policy,
            scopes=module_scopes(working) if policy != "none" else None,
        )
        self._sources = _parameter_sources(working, acc.weights, graphs.partition.parameters)
        self._graphs = graphs
        self._checked = False
        _replace_working_model(acc, graphs.training)
        return out

    @property
    def is_built(self) -> bool:
        """True once the block was called in a build (its training and eval models exist)."""
        return getattr(self, "_graphs", None) is not None

    def _require_built(self, what: str) -> None:
        if not self.is_built:
            raise NotBuiltError(
                f"{type(self).__name__} has not been built yet, so its {what} are not known: "
                "call the block "
                "inside `with onnxblocks.base(model):` first. (Please build the training model "
                "first before "
                "trying to retrieve the parameters.)"
            )

    def training_graphs(self) -> TrainingGraphs:
        """The :class:`~onnxblocks.gradient.TrainingGraphs` (models with held stubs, partition,
        outputs).

        The models hold stubs in place of large initializers: save them with
        ``onnxblocks.io.save_model(model, path, weights=block.weight_store())``.

        Raises:
            NotBuiltError: before the block was built.
        """
        self._require_built("training graphs")
        return self._graphs

    def weight_store(self) -> _weights.WeightStore:
        """Where the bytes of the models' held stubs are (for ``onnxblocks.io.save_model``).

        Raises:
            NotBuiltError: before the block was built.
        """
        self._require_built("weights")
        return self._accessor.weights

    # Views a subclass may shadow (``self.weights = ...``); see _BuildView.
    graphs = _BuildView(training_graphs)
    weights = _BuildView(weight_store)

    def parameter_sources(self) -> tuple[list[_weights.TensorSource], list[_weights.TensorSource]]:
        """``(trainable, frozen)`` parameters as TensorSources: where their bytes are, without
        copying them.

        Raises:
            NotBuiltError: before the block was built.
        """
        self._require_built("parameters")
        partition = self._graphs.partition
        return (
            [self._sources[n] for n in partition.trainable],
            [self._sources[n] for n in partition.frozen],
        )

    def parameters(self) -> tuple[list[onnx.TensorProto], list[onnx.TensorProto]]:
        """``(trainable, frozen)`` parameters as complete TensorProtos, in input order.

        Each call returns new TensorProtos holding a copy of the data; use
        :meth:`parameter_sources` to stream large parameters instead.

        Raises:
            NotBuiltError: before the block was built.
        """
        trainable, frozen = self.parameter_sources()
        return [s.to_tensor_proto() for s in trainable], [s.to_tensor_proto() for s in frozen]

    def to_model_proto(self) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        """The complete ``(training_model, eval_model)``, checked once and loadable by ONNX Runtime.

        Raises:
            NotBuiltError: before the block was built.
            onnx.checker.ValidationError: if a model is invalid.
        """
        self._require_built("models")
        self._check_models()
        acc: ModelAccessor = self._accessor
        return acc.materialize(self._graphs.training), acc.materialize(self._graphs.eval)

    def check(self) -> None:
        """Run onnx's checker once on both models' skeletons (no weight bytes are read; done once
        per build).

        Raises:
            NotBuiltError: before the block was built.
            onnx.checker.ValidationError: if a model is invalid.
        """
        self._check_models()

    def _check_models(self) -> None:
        self._require_built("models")
        if not self._checked:
            from onnxblocks.gradient import check_training_model

            check_training_model(self._graphs.training)
            check_training_model(self._graphs.eval, "the eval model")
            self._checked = True


def _parameter_sources(
    model: ir.Model, store: _weights.WeightStore, names: tuple[str, ...]
) -> dict[str, _weights.TensorSource]:
    """Where each parameter's bytes are: the held source, or a copy of a small inline
    initializer.
    """
    sources: dict[str, _weights.TensorSource] = {}
    for name in names:
        value = model.graph.initializers[name]
        # a held stub is an external tensor of the IR
        if _weights.is_held_location(getattr(value.const_value, "location", "")):
            sources[name] = store.source(name)
        else:
            assert value.const_value is not None
            tensor = ir.serde.serialize_tensor(value.const_value)
            sources[name] = _weights.TensorSource(
                name, tensor.data_type, tuple(tensor.dims), tensor=tensor
            )
    return sources


def _replace_working_model(acc: ModelAccessor, model: onnx.ModelProto) -> None:
    """Make ``model`` the accessor's working model (the reference leaves the training model
    there).
    """
    acc.replace_model(model)
