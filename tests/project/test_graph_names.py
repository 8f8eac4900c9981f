"""Graph and checkpoint names two parties must agree on are spelled in one module only.

``onnxblocks/_core/contracts.py`` defines the gradient and accumulation names
(``<p>_grad``, ``<p>_grad.accumulation.buffer``, ``lazy_reset_grad``), the
optimizer models' inputs and the moments' names (``<p>.exp_avg``...), and the
checkpoint's optimizer layout (``group0``, ``momentum<k>``, ``onnxblocks.step``).
Every other module builds or parses them through its functions, so that a name
changed there changes everywhere. This test reads every module's string literals
(f-string pieces and regular expressions included; docstrings left out: they
explain the names) and refuses those that spell one of these names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "onnxblocks"
CONTRACTS = PACKAGE / "_core" / "contracts.py"
GENERATED = PACKAGE / "checkpoint" / "_generated"

#: What spells a contract name: the gradient suffix after a name or placeholder (``{p}_grad``,
#: ``)_grad(`` in a regex; not ``clip_grad`` or ``requires_grad``), the accumulation suffixes,
#: the reset input, the optimizer's state sequences, the moments' suffixes and the checkpoint's
#: optimizer layout.
SPELLINGS = re.compile(
    r"(?<![A-Za-z0-9])_grad(?![A-Za-z])"
    r"|\.accumulation\.(buffer|out)"
    r"|lazy_reset_grad"
    r"|(first|second|third|fourth)_order_moments"
    r"|\.exp_avg"
    r"|\bmomentum(\d|\{)"
    r"|\bgroup0\b"
    r"|\bonnxblocks\.step\b"
)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spellings(path: Path) -> list[tuple[int, str]]:
    """``(line, literal)`` for each string literal of ``path`` that spells a contract name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    hits = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and SPELLINGS.search(node.value)
    ]
    return sorted(hits)


def test_contract_names_are_spelled_only_in_contracts():
    modules = [
        p for p in sorted(PACKAGE.rglob("*.py")) if p != CONTRACTS and GENERATED not in p.parents
    ]
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {literal!r:.80}"
        for path in modules
        for line, literal in spellings(path)
    ]
    assert not found, (
        "These literals spell names onnxblocks/_core/contracts.py defines; build or parse them "
        "with its functions (gradient_name, buffer_name, gradient_of, moment_names, "
        "checkpoint_moment_name...) instead:\n" + "\n".join(found)
    )


def test_the_scan_finds_each_kind_of_spelling(tmp_path):
    # the scan sees through f-strings and regular expressions, and passes the names that only
    # look alike
    module = tmp_path / "spelled.py"
    module.write_text(
        '"""Docs may say <p>_grad."""\n'
        'a = f"{p}_grad"\n'
        'b = r"^(?P<value>.+)_grad(_\\d+)?$"\n'
        'c = p + ".accumulation.buffer"\n'
        'd = "momentum{}".format(k)\n'
        'e = {"group0": 1}\n'
        'f = ("clip_grad", "requires_grad", "max_grad_norm", "momentum", "exp_avg")\n',
        encoding="utf-8",
    )
    assert [line for line, _ in spellings(module)] == [2, 3, 4, 5, 6]
