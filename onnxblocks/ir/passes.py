"""The one pass contract.

Every rewrite and lowering onnxblocks makes is a :class:`Pass`: an in-place
``onnx_ir`` pass whose :meth:`Pass.call` edits an ``ir.Model`` and returns a
:class:`PassResult` saying what changed (``changes``: a count per kind of change,
e.g. per op type lowered; ``modified`` is true when any count is non-zero).
Passes compose with :func:`run_passes` (or ``onnx_ir.passes.PassManager``).

A precondition that does not hold is not an exception deep inside the pass: the
pass returns unchanged, or raises the :class:`~onnxblocks.errors.OnnxBlocksError`
that says what to do.
"""

from __future__ import annotations

import abc
import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping

import onnx_ir as ir


@dataclasses.dataclass
class PassResult(ir.passes.PassResult):
    """What a pass did.

    Attributes:
        model: The model (the same object: passes edit in place).
        modified: Whether anything changed.
        changes: How many changes of each kind (e.g. ``{"ReluGrad": 2}``).
    """

    changes: Mapping[str, int] = dataclasses.field(default_factory=dict)


class Pass(ir.passes.InPlacePass):
    """An in-place pass over an ``ir.Model`` that reports its changes.

    Subclasses implement :meth:`apply`, returning the count of changes per kind
    (an empty mapping when nothing changed).
    """

    #: A short name for reports (defaults to the class name).
    name: str = ""

    @abc.abstractmethod
    def apply(self, model: ir.Model) -> Mapping[str, int]:
        """Edit ``model`` in place; return how many changes of each kind were made."""

    def call(self, model: ir.Model) -> PassResult:
        changes = {k: v for k, v in dict(self.apply(model)).items() if v}
        return PassResult(model=model, modified=bool(changes), changes=changes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def run_passes(model: ir.Model, passes: Iterable[Pass]) -> dict[str, Counter[str]]:
    """Run ``passes`` in order over ``model``; return each pass's changes, by pass name."""
    report: dict[str, Counter[str]] = {}
    for p in passes:
        result = p(model)
        report.setdefault(p.name or type(p).__name__, Counter()).update(
            getattr(result, "changes", {})
        )
    return report
