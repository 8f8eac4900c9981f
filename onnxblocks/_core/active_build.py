"""Which build the running code adds nodes to: one context-scoped slot.

The slot lives in a :class:`contextvars.ContextVar`, so builds in two threads (or
two asyncio tasks) never see each other, and a nested build restores the outer
one when it ends. :mod:`onnxblocks.blocks` puts its ``ModelAccessor`` here; code
below the blocks layer (the contrib op declarations) reaches the active build
through the :class:`Builder` protocol, without importing ``blocks``.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import onnx

from onnxblocks._core.errors import FileMissingError, NoActiveModelError


class Builder(Protocol):
    """What the active build offers to code that adds nodes (``ModelAccessor`` implements it)."""

    def op(
        self,
        op_type: str,
        inputs: Sequence[str | None],
        *,
        domain: str = "",
        outputs: int | Sequence[str] = 1,
        name: str | None = None,
        output_types: Sequence[onnx.TypeProto | None] | None = None,
        **attributes: Any,
    ) -> Any:
        """Add one node and return its output value(s)."""

    def type_of(self, name: str) -> onnx.TypeProto | None:
        """The type of a value, or None if unknown."""

    def where(self) -> str:
        """A prefix naming the block being built, for error messages."""


_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("onnxblocks_build", default=None)
_CUSTOM_OP_LIBRARIES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "onnxblocks_custom_op_libraries", default=()
)


def active() -> Any:
    """The active build, or None outside a build."""
    return _ACTIVE.get()


def current() -> Any:
    """The active build.

    Raises:
        NoActiveModelError: outside ``onnxblocks.base(...)`` / ``onnxblocks.empty_base()``.
    """
    build = _ACTIVE.get()
    if build is None:
        raise NoActiveModelError(
            "No model is being built here. Call blocks inside `with onnxblocks.base(model):` "
            "or `with onnxblocks.empty_base():`."
        )
    return build


@contextmanager
def activate(build: Any) -> Iterator[Any]:
    """Make ``build`` the active build inside the ``with`` block, then restore the previous one."""
    token = _ACTIVE.set(build)
    try:
        yield build
    finally:
        _ACTIVE.reset(token)


@contextmanager
def custom_op_library(path: str | os.PathLike) -> Iterator[str]:
    """Register a custom op library (a shared object) for the builds inside this block.

    ONNX Runtime loads it when it optimizes the model and builds its gradient.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    resolved = os.fspath(path)
    if not os.path.isfile(resolved):
        raise FileMissingError(
            f"Custom op library '{resolved}' does not exist. Pass the path of the compiled shared "
            "library (.so/.dll/.dylib) that registers your custom ops."
        )
    token = _CUSTOM_OP_LIBRARIES.set((*_CUSTOM_OP_LIBRARIES.get(), resolved))
    try:
        yield resolved
    finally:
        _CUSTOM_OP_LIBRARIES.reset(token)


def custom_op_libraries() -> tuple[str, ...]:
    """Custom op libraries registered in the current context."""
    return _CUSTOM_OP_LIBRARIES.get()
