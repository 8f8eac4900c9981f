"""The one rule by which tests compare numbers with a reference (torch, PEFT, NumPy, another backend, Python).

A tolerance found by trying values on one CPU is a test of that CPU: another CPU (AVX-512 against AVX2), another
thread count or another summation order rounds differently. The bound here is taken from the reference itself.

``assert_close(actual, expected, expected64, rtol=..., scale=...)`` passes element by element when either holds:

1. ``|actual - expected| <= rtol * |expected|``: within the stated relative bound of the reference computed in
   the tested dtype;
2. ``|actual - expected64| <= ROUNDING_MULTIPLE * |expected - expected64| + floor``: within a small multiple of
   the distance between the reference in the tested dtype and the same reference in float64 (the rounding the
   reference itself has, which another implementation may have in another order), plus an absolute floor.

The floor is ``FLOOR_ULPS * eps(dtype) * scale``: ``scale`` is the magnitude of the operands that produced each
element (for a sum, the sum of ``|terms|``; for a gradient of a mean, the mean of ``|terms|``), broadcast against
the value. Without a ``scale`` it is the largest ``|expected64|`` in the tensor: an element near zero of a tensor
whose other elements are of order one is rounded at that order (a norm-wise bound). Nothing here is a bare
absolute tolerance: an element whose operands are zero must be zero.

Without a float64 reference (two float32 implementations of ours compared with each other, where neither is the
truth) only rule 1 applies, with the floor added: ``|actual - expected| <= rtol * |expected| + floor``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: how many times the reference's own float32-vs-float64 distance another summation order may be off
ROUNDING_MULTIPLE = 8.0
#: the floor in units of the tested dtype's machine epsilon, times the operands' magnitude
FLOOR_ULPS = 16.0

_EPS = {
    "float16": float(np.finfo(np.float16).eps),
    "bfloat16": 2.0**-7,
    "float32": float(np.finfo(np.float32).eps),
    "float64": float(np.finfo(np.float64).eps),
}


def _array(value: Any) -> np.ndarray:
    """A NumPy array of any tensor-like (torch tensors through ``detach().cpu()``, ml_dtypes bfloat16 upcast)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":
        array = array.astype(np.float32)
    return array


def eps(dtype: Any) -> float:
    """The machine epsilon of a float dtype (NumPy, torch or ml_dtypes); integers and bools compare exactly."""
    name = str(dtype).removeprefix("torch.")
    if name in _EPS:
        return _EPS[name]
    return 0.0


def dtype_name(value: Any) -> str:
    """The dtype of a tensor-like as a plain name (``float32``, ``bfloat16``...)."""
    dtype = (
        value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
    )  # no NumPy copy of a torch bfloat16
    return str(dtype).removeprefix("torch.")


def floor(reference64: np.ndarray, *, dtype: str, scale: Any | None = None) -> np.ndarray:
    """The absolute floor per element: ``FLOOR_ULPS * eps(dtype) * scale`` (see the module's text)."""
    e = eps(dtype)
    if scale is None:
        finite = np.abs(
            reference64[np.isfinite(reference64)]
        )  # an inf or a NaN compares exactly, not by size
        magnitude = float(np.max(finite)) if finite.size else 0.0
        return np.full(reference64.shape, FLOOR_ULPS * e * magnitude)
    return np.broadcast_to(
        FLOOR_ULPS * e * np.abs(_array(scale).astype(np.float64)), reference64.shape
    )


def check_close(
    actual: Any,
    expected: Any,
    expected64: Any | None = None,
    *,
    rtol: float,
    scale: Any | None = None,
    name: str = "value",
) -> str | None:
    """``None`` when ``actual`` matches the reference by the rule above, else a report of the worst element."""
    act = _array(actual)
    exp = _array(expected)
    if act.shape != exp.shape:
        return f"{name}: shape {act.shape} against the reference's {exp.shape}"
    if not np.issubdtype(exp.dtype, np.inexact):
        if np.array_equal(act, exp):
            return None
        index = tuple(int(i) for i in np.argwhere(act != exp)[0])
        return f"{name}: integer values differ, first at {index}: {act[index]} against {exp[index]}"
    act64 = act.astype(np.float64)
    exp64 = exp.astype(np.float64)
    ref64 = exp64 if expected64 is None else _array(expected64).astype(np.float64)
    if ref64.shape != exp64.shape:
        return f"{name}: the float64 reference has shape {ref64.shape}, the reference {exp64.shape}"
    finite = np.isfinite(exp64)
    if not np.array_equal(act64[~finite], exp64[~finite], equal_nan=True):
        return f"{name}: the non-finite elements differ from the reference's"
    # the non-finite elements are equal (above): compare the finite ones, with the others set to zero
    act64, exp64, ref64 = (np.where(finite, a, 0.0) for a in (act64, exp64, ref64))
    # the coarser of the two dtypes rounds: a float32 result against a float64 torch run is a float32 result
    dtype = max(dtype_name(actual), dtype_name(expected), key=eps)
    low = floor(ref64, dtype=dtype, scale=scale)
    error = np.where(finite, np.abs(act64 - exp64), 0.0)
    if expected64 is None:
        allowed = rtol * np.abs(exp64) + low
    else:
        own = np.abs(exp64 - ref64)
        # rule 2 measured from the tested-dtype reference: |a - e| <= |a - e64| + |e - e64|
        allowed = np.maximum(rtol * np.abs(exp64), (ROUNDING_MULTIPLE + 1.0) * own + low)
        within = np.abs(act64 - ref64) <= ROUNDING_MULTIPLE * own + low
        error = np.where(within, 0.0, error)
    ok = (error <= allowed) | ~finite
    if np.all(ok):
        return None
    excess = np.where(ok, -np.inf, error - allowed)
    worst = np.unravel_index(int(np.argmax(excess)), act.shape) if act.ndim else ()
    parts = [
        f"{name}: {int(np.sum(~ok))} of {act.size} elements outside the bound; worst at {tuple(map(int, worst))}:",
        f"{act64[worst]!r} against {exp64[worst]!r} ({dtype})",
    ]
    if expected64 is not None:
        parts.append(f"float64 reference {ref64[worst]!r}")
    parts.append(f"|difference| {error[worst]:.3g}, allowed {allowed[worst]:.3g} (rtol {rtol:g})")
    return " ".join(parts)


def assert_close(
    actual: Any,
    expected: Any,
    expected64: Any | None = None,
    *,
    rtol: float,
    scale: Any | None = None,
    name: str = "value",
) -> None:
    """Assert that ``actual`` matches the reference by the module's rule; the message names the worst element."""
    report = check_close(actual, expected, expected64, rtol=rtol, scale=scale, name=name)
    assert report is None, report


def is_close(
    actual: Any,
    expected: Any,
    expected64: Any | None = None,
    *,
    rtol: float,
    scale: Any | None = None,
) -> bool:
    """Whether ``actual`` matches the reference by the module's rule (for tests that search, not assert)."""
    return check_close(actual, expected, expected64, rtol=rtol, scale=scale) is None


def assert_equal(actual: Any, expected: Any, *, name: str = "value") -> None:
    """Assert bit-identical values (same shape, same elements; NaNs in the same places)."""
    act, exp = _array(actual), _array(expected)
    assert act.shape == exp.shape, f"{name}: shape {act.shape} against {exp.shape}"
    assert np.array_equal(act, exp, equal_nan=np.issubdtype(exp.dtype, np.inexact)), (
        f"{name}: not bit-identical; largest difference {np.max(np.abs(act.astype(float) - exp.astype(float))):.3g}"
    )
