"""Tests compare numbers with a reference through one rule (``tests/support/numerics.py``), never a bare atol."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
HELPER = TESTS / "support" / "numerics.py"
#: every spelling of a bare tolerance comparison in NumPy, torch, pytest and the standard library
BARE = re.compile(
    r"assert_allclose|\ballclose\(|\bisclose\(|assert_array_almost_equal|assert_almost_equal"
    r"|testing\.assert_close|pytest\.approx|\bapprox\("
)


def test_no_bare_tolerance_comparison_outside_the_helper():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == HELPER or path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BARE.search(line):
                offenders.append(f"{path.relative_to(TESTS)}:{number}: {line.strip()}")
    assert not offenders, (
        "compare with a reference through support.numerics.assert_close (float64 reference, floor from the "
        f"operands), not a bare tolerance; {len(offenders)} places:\n" + "\n".join(offenders)
    )
