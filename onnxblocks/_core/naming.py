"""Unique names derived from the graph being built, never from a process-wide counter."""

from __future__ import annotations

import re
from collections.abc import Iterable

_UNSAFE = re.compile(r"[^0-9A-Za-z_.:/-]+")


class NameAuthority:
    """Hands out names that are unique within one graph.

    Generated names have the form ``{hint}_{n}``; the counter is per hint and per
    graph, and skips every name already in use, so a name the user chose is never
    taken or renamed.
    """

    def __init__(self, used: Iterable[str] = ()) -> None:
        self._used: set[str] = set(used)
        self._next: dict[str, int] = {}

    def reserve(self, name: str) -> None:
        """Mark ``name`` as taken."""
        self._used.add(name)

    def is_used(self, name: str) -> bool:
        """True when ``name`` is already taken in this graph."""
        return name in self._used

    def fresh(self, hint: str) -> str:
        """Return a new unique name built from ``hint`` and reserve it."""
        hint = _UNSAFE.sub("_", hint) or "value"
        n = self._next.get(hint, 0)
        while f"{hint}_{n}" in self._used:
            n += 1
        name = f"{hint}_{n}"
        self._next[hint] = n + 1
        self._used.add(name)
        return name
