"""Rich display by registration: core classes ask, the display layer answers.

Core classes inherit :class:`HtmlDisplay`, whose ``_repr_html_`` (what Jupyter
calls) looks the object's class up in a :func:`functools.singledispatch`
registry. :mod:`onnxblocks.display` fills the registry with :func:`register`;
the core never imports the display. The package's top level installs a loader
(:func:`set_loader`) that imports the display on the first lookup, so a notebook
shows objects richly without importing ``onnxblocks.display`` itself.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_loader: Callable[[], object] | None = None


@functools.singledispatch
def _render(obj: object) -> str | None:
    return None


def register(cls: type) -> Callable[[Callable[[Any], str | None]], Callable[[Any], str | None]]:
    """Decorator: register the HTML renderer of ``cls`` (and of its subclasses without one of
    their own).
    """
    return _render.register(cls)


def set_loader(loader: Callable[[], object]) -> None:
    """Set the function that registers the renderers (run once, on the first :func:`to_html`)."""
    global _loader
    _loader = loader


def to_html(obj: object) -> str | None:
    """The HTML of ``obj`` from its registered renderer, or None when it has none or rendering
    failed.

    Never raises: Jupyter falls back to ``repr`` on None.
    """
    global _loader
    if _loader is not None:
        loader, _loader = _loader, None
        try:
            loader()
        except ImportError:  # the display layer is optional
            logger.debug("no display renderers", exc_info=True)
    try:
        return _render(obj)
    except Exception:  # a display must never break the notebook
        logger.debug("rendering %s failed", type(obj).__name__, exc_info=True)
        return None


class HtmlDisplay:
    """Mixin: Jupyter displays instances with the renderer registered for their class."""

    def _repr_html_(self) -> str | None:
        return to_html(self)
