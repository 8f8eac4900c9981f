"""Block and ForwardBlock: the units a build is composed of."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import onnx

from onnxblocks._core.errors import InvalidTypeError, NotBuiltError, preview
from onnxblocks._core.html import HtmlDisplay
from onnxblocks.blocks.accessor import ModelAccessor
from onnxblocks.blocks.opening import current
from onnxblocks.blocks.value import as_values

_T = TypeVar("_T")


class _BuildView(Generic[_T]):
    """A read-only attribute computed from the build that a subclass may shadow with its own
    attribute.

    Unlike a ``property``, it defines no ``__set__``: ``self.nodes = [...]`` or
    ``self.weights = [0.3, 0.7]`` in a subclass's ``__init__`` (common in blocks
    written for the reference) stores an ordinary instance attribute, which then
    takes precedence. The library itself reads the private state, not these views.
    """

    def __init__(self, getter: Callable[[Any], _T]) -> None:
        self._getter = getter
        self.__doc__ = getter.__doc__

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self._getter(obj)


def _active_accessor(_block: Block) -> ModelAccessor:
    """The accessor of the active build."""
    return current()


def added_nodes(block: Block) -> list[str]:
    """Names of the nodes this block added the last time it was called."""
    return list(getattr(block, "_nodes", []))


#: ``build`` parameter annotations that mean "the name of a value of the model" (checked before
#: ``build`` runs).
_NAME_ANNOTATIONS = ("str", "Value", "str | Value", "Value | str", str)


class Block(HtmlDisplay, ABC):
    """Base class of everything that adds nodes to the model being built.

    Subclasses implement :meth:`build`, which receives value names and returns
    the name (or names) of what it produced. Calling a block runs ``build``
    against the active build (see :func:`onnxblocks.base`); inside ``build``,
    ``self.base`` is the ModelProto being built and :attr:`accessor` gives the
    node-adding API.

    A subclass that never calls ``super().__init__()`` still works.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # accepts the reference's temp_file_name
        self._nodes: list[str] = []

    @abstractmethod
    def build(self, *args: Any, **kwargs: Any) -> Any:
        """Add this block's nodes and return the name(s) of its output(s)."""

    accessor = _BuildView(_active_accessor)

    @property
    def base(self) -> onnx.ModelProto:
        """The ModelProto being built (for code that edits the proto directly).

        A view of the build's model: edits reach the build, and nodes the build adds later
        show in it (:mod:`onnxblocks.blocks.proto_view`).
        """
        return current().working_model

    @base.setter
    def base(self, _model: onnx.ModelProto) -> None:
        """Ignored (the reference assigned it): the model is always the active build's."""

    nodes = _BuildView(added_nodes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Build this block into the active model and return its output Value(s)."""
        acc = current()
        self._check_arity(acc, args, kwargs)
        start = acc.node_count()
        acc.block_stack.append(self)
        args = tuple(as_values(a) if isinstance(a, str) else a for a in args)
        kwargs = {k: as_values(v) if isinstance(v, str) else v for k, v in kwargs.items()}
        try:
            out = self.build(*args, **kwargs)
        finally:
            acc.block_stack.pop()
        self._nodes = [n.name or f"#{start + i}" for i, n in enumerate(acc.nodes_since(start))]
        self._accessor = acc
        return as_values(out)

    def _check_arity(self, acc: ModelAccessor, args: tuple, kwargs: dict) -> None:
        try:
            signature = inspect.signature(self.build)
        except (TypeError, ValueError):
            return
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            params = [p for p in signature.parameters.values() if p.kind not in (p.VAR_KEYWORD,)]
            required = [
                p.name for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL
            ]
            names = ", ".join(
                p.name if p.kind is not p.VAR_POSITIONAL else "*" + p.name for p in params
            )
            if any(p.kind is p.VAR_POSITIONAL for p in params):
                count = f"at least {len(required)}"
            elif len(required) == len(params):
                count = f"{len(params)}"
            else:
                count = f"{len(required)} to {len(params)}"
            outputs = acc.output_names()
            raise InvalidTypeError(
                f"{type(self).__name__}.build takes {count} input(s) ({names}) but was called with "
                f"{len(args)} positional and {len(kwargs)} keyword argument(s) ({exc}). "
                f"The model's outputs are {preview(outputs)}; pass the ones this block needs."
            ) from None
        for (
            name,
            given,
        ) in bound.arguments.items():  # a value name given as a number, a list...: say which
            param = signature.parameters[name]
            if param.annotation not in _NAME_ANNOTATIONS:
                continue
            for value in given if param.kind is param.VAR_POSITIONAL else (given,):
                if isinstance(value, str):
                    continue
                outputs = acc.output_names()
                raise InvalidTypeError(
                    f"{type(self).__name__}: {name} must be the name of a value of the model (a "
                    "str or Value), "
                    f"not {type(value).__name__} {value!r:.40}. The model's outputs are "
                    f"{preview(outputs)}."
                )


class ForwardBlock(Block):
    """A block whose outputs become the graph outputs of a forward model.

    ``build`` returns the name(s) that become the graph outputs (replacing the
    previous ones). After the block was called, :meth:`to_model_proto` returns the
    finished model, checked once and loadable by the installed onnxruntime.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = super().__call__(*args, **kwargs)
        names = list(out) if isinstance(out, (tuple, list)) else [out]
        self._accessor.set_outputs([n for n in names if n is not None])
        self._built = True
        return out

    def to_model_proto(self) -> onnx.ModelProto:
        """The forward model this block built.

        Raises:
            NotBuiltError: if the block has not been called yet.
        """
        if not getattr(self, "_built", False):
            raise NotBuiltError(
                f"{type(self).__name__} has not been built yet: call it inside "
                "`with onnxblocks.base(model):` first, then call to_model_proto()."
            )
        return self._accessor.finish()
