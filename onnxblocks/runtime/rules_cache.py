"""Index rules kept on disk by model content, for processes that open the same artifacts again.

Finding a model's index rules (:func:`~onnxblocks.runtime.index_rules.index_rules`) may run ONNX
shape inference over the whole training graph. A Flower SuperNode starts a fresh ClientApp process
for every message, so without a cache each round pays it again for artifacts that never changed.
Inside :func:`keep_rules_in` the rules a session finds are written to, and read back from, one JSON
file per model and input list, named by a SHA-256 of the serialized model and the inputs: a changed
model is a new file, never a stale rule. A file that cannot be read or parsed is recomputed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path

import onnx

from onnxblocks.runtime.index_rules import IndexRule, index_rules

#: The directory this context keeps index rules in (None: found anew every time).
_CACHE_DIR: ContextVar[Path | None] = ContextVar("onnxblocks_index_rules_cache", default=None)


@contextlib.contextmanager
def keep_rules_in(directory: str | os.PathLike) -> Iterator[Path | None]:
    """Sessions opened inside this block keep their index rules in ``directory`` (created, owner
    only) and read them back from it. A directory another user owns is not used: its rules could
    loosen the batch checks.

    Yields:
        The directory, or None when it is not used.
    """
    wanted = Path(directory)
    path: Path | None = wanted
    try:
        wanted.mkdir(mode=0o700, parents=True, exist_ok=True)
        if hasattr(os, "getuid") and wanted.stat().st_uid != os.getuid():
            path = None
    except OSError:
        path = None  # nothing kept: every session finds its rules anew
    token = _CACHE_DIR.set(path)
    try:
        yield path
    finally:
        _CACHE_DIR.reset(token)


def rules_file(model: onnx.ModelProto, inputs: Sequence[str]) -> str:
    """The name of the file that keeps ``model``'s index rules of ``inputs``."""
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    digest.update("\0".join(inputs).encode())
    return f"index-rules-{digest.hexdigest()}.json"


def cached_index_rules(model: onnx.ModelProto, inputs: Sequence[str]) -> list[IndexRule]:
    """:func:`~onnxblocks.runtime.index_rules.index_rules`, read from the context's cache
    directory when it holds them (see :func:`keep_rules_in`), else found and written there.
    """
    directory = _CACHE_DIR.get()
    if directory is None:
        return index_rules(model, inputs)
    path = directory / rules_file(model, inputs)
    try:
        kept = _rules(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        kept = None
    if kept is not None:
        return kept
    # not kept yet, or unreadable: found anew and written again
    rules = index_rules(model, inputs)
    _write(path, [_entry(rule) for rule in rules])
    return rules


_FIELDS = ("input", "low", "high", "allowed", "what")


def _entry(rule: IndexRule) -> dict[str, object]:
    return {
        "input": rule.input,
        "low": rule.low,
        "high": rule.high,
        "allowed": sorted(rule.allowed),
        "what": rule.what,
    }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rules(data: object) -> list[IndexRule] | None:
    """The rules a kept file holds, or None when it is not exactly what :func:`_entry` writes."""
    if not isinstance(data, list):
        return None
    rules = []
    for entry in data:
        if not isinstance(entry, dict) or sorted(entry) != sorted(_FIELDS):
            return None
        bounds, allowed = (entry["low"], entry["high"]), entry["allowed"]
        if not all(b is None or _is_int(b) for b in bounds):
            return None
        if not isinstance(allowed, list) or not all(_is_int(v) for v in allowed):
            return None
        if not isinstance(entry["input"], str) or not isinstance(entry["what"], str):
            return None
        rules.append(
            IndexRule(entry["input"], bounds[0], bounds[1], frozenset(allowed), entry["what"])
        )
    return rules


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    """Write ``entries`` to ``path`` whole (a process reading it meanwhile sees the old file or
    none); a directory that cannot be written only costs the next process the work.
    """
    try:
        fd, staged = tempfile.mkstemp(prefix=".index-rules-", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entries, f)
        os.replace(staged, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(staged)
