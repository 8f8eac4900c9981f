"""Import paths kept for one release: the ``__getattr__`` of a module whose names live elsewhere,
each read warning with a DeprecationWarning that names the import to use.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any


def moved_names(
    module: str, names: Iterable[str], home: str, find: Callable[[str], Any]
) -> Callable[[str], Any]:
    """``module``'s ``__getattr__``: each of ``names`` is ``find(name)``, with a
    DeprecationWarning saying to import it from ``home``; any other name raises AttributeError.
    """
    known = frozenset(names)

    def __getattr__(name: str) -> Any:  # noqa: N807 - it is the module's __getattr__
        if name not in known:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is deprecated: import it from {home}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return find(name)

    return __getattr__
