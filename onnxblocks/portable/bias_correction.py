"""Adam's bias corrections ``1 - beta**t`` in float32, accurate to about 3e-7 relative.

The obvious float32 form, ``1 - Pow(beta, t)``, cancels: for ``beta = 0.999`` and ``t = 1``
the difference keeps only the last few bits of ``beta**t``, and every update moves by about
3e-5 relative. Computing the power in float64 is exact enough but puts float64 tensors in the
graph, which several onnxruntime builds (the WebGPU bundles of onnxruntime-web) have no kernels
for. Here the correction is ``-expm1(x)`` with ``x = t * log(beta)``:

* for ``x >= -0.5`` by its Taylor series, ``-x * (1 + x/2! + x**2/3! + ... + x**8/9!)``,
  which holds no subtraction of nearly equal numbers (truncation below 1e-8 relative);
* below, as ``1 - exp(x)``, where ``exp(x) <= 0.61`` so the difference loses under two bits.

Only multiplications, additions and one ``Exp`` are written (no ``Log`` near 1, whose accuracy
some GPU backends do not promise), over a vector holding every ``beta`` of the step, so the
node count does not grow with the number of corrections. ``log(beta)`` is taken in Python
double and rounded to float32 once; the error of ``x`` carries into the result at most once
(``|x e^x / expm1(x)| <= 1``). ``tests/portable/test_bias_correction.py`` checks the graph
against NumPy float64 up to step 10**6 (within 1e-6 relative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnxblocks.ir.writer import Writer

#: Below this ``x = t * log(beta)`` the correction is ``1 - exp(x)``; above it, the series.
SERIES_LIMIT = -0.5
#: The series' degree: ``0.5**9 / 10!`` is under 1e-9, far below float32's rounding.
SERIES_DEGREE = 8


def float_step(w: Writer, step: ir.Value) -> ir.Value:
    """The int64 ``[1]`` step as a float32 scalar (exact up to 2**24 steps)."""
    return w.cast(w.reshape(step, []), ir.DataType.FLOAT)


def bias_corrections(w: Writer, betas: Sequence[float], step: ir.Value) -> list[ir.Value]:
    """``1 - beta**step`` for each of ``betas``, as float32 scalars.

    Args:
        w: The writer.
        betas: The decay rates, each in ``[0, 1)``, as the optimizer holds them (Python floats;
            the training build's kernel rounds its attributes to float32 first: pass those).
        step: The step as a float32 scalar (:func:`float_step`).

    Returns:
        One float32 scalar per beta, in order.
    """
    logs = np.array([_log(b) for b in betas], dtype=np.float32)
    x = w.op("Mul", [step, w.const(logs, suffix="log_beta")])
    # the series of -expm1(x) / x, negated coefficients in Horner's order (highest first)
    series = w.scalar(-1.0 / math.factorial(SERIES_DEGREE + 1))
    for k in range(SERIES_DEGREE, 0, -1):
        series = w.op("Add", [w.op("Mul", [series, x]), w.scalar(-1.0 / math.factorial(k))])
    small = w.op("Mul", [x, series])
    large = w.op("Sub", [w.scalar(1.0), w.op("Exp", [x])])
    far = w.op("Less", [x, w.scalar(SERIES_LIMIT)])
    corrections = w.op("Where", [far, large, small])
    if len(betas) == 1:
        return [w.reshape(corrections, [])]
    return [
        w.op("Gather", [corrections, w.const(np.int64(i), suffix="index")], axis=0)
        for i in range(len(betas))
    ]


def _log(beta: float) -> float:
    """``log(beta)`` in double; ``-inf`` for a beta of 0 (corrected to 1 from the first step)."""
    return math.log(beta) if beta > 0 else -math.inf


__all__ = ["SERIES_DEGREE", "SERIES_LIMIT", "bias_corrections", "float_step"]
