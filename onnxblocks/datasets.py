"""Small synthetic datasets generated in code (deterministic, no downloads, no licences).

Used by ``onnxblocks demo`` and handy for trying the runtime.
"""

from __future__ import annotations

import numpy as np

from onnxblocks._core.errors import InvalidValueError


def spirals(
    points_per_class: int = 400,
    classes: int = 3,
    turns: float = 0.8,
    noise: float = 0.08,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved spiral arms in the plane, one arm per class.

    Point ``i`` of arm ``k`` sits at radius ``r = t`` and angle
    ``2 * pi * (k / classes + turns * t)`` with ``t`` evenly spaced in
    ``(0.05, 1]``, plus Gaussian noise of standard deviation ``noise`` on both
    coordinates. The rows are shuffled.

    Args:
        points_per_class: Points on each arm.
        classes: Number of arms (classes).
        turns: How far each arm winds (1.0 is a full turn).
        noise: Standard deviation of the noise added to the coordinates.
        seed: Seed of ``numpy.random.default_rng``; same seed, same data.

    Returns:
        ``(features, labels)``: float32 ``[N, 2]`` and int64 ``[N]`` with
        ``N = points_per_class * classes``.

    Raises:
        ValueError: for fewer than 1 point or 2 classes, or negative noise.
    """
    if points_per_class < 1 or classes < 2:
        raise InvalidValueError(
            f"spirals needs points_per_class >= 1 and classes >= 2, got {points_per_class}, "
            f"{classes}."
        )
    if noise < 0:
        raise InvalidValueError(f"spirals: noise must be >= 0, got {noise}.")
    rng = np.random.default_rng(seed)
    t = np.linspace(0.05, 1.0, points_per_class)
    features, labels = [], []
    for k in range(classes):
        angle = 2 * np.pi * (k / classes + turns * t)
        arm = np.stack([t * np.cos(angle), t * np.sin(angle)], axis=1)
        features.append(arm + rng.normal(0.0, noise, arm.shape))
        labels.append(np.full(points_per_class, k, np.int64))
    x = np.concatenate(features).astype(np.float32)
    y = np.concatenate(labels)
    order = rng.permutation(len(x))
    return x[order], y[order]


def train_val_split(
    features: np.ndarray, labels: np.ndarray, val_fraction: float = 0.2
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Split aligned arrays into training and validation parts (the last ``val_fraction`` of the
    rows).

    Raises:
        ValueError: if ``val_fraction`` is not in ``(0, 1)`` or leaves a part empty.
    """
    if not 0 < val_fraction < 1:
        raise InvalidValueError(f"val_fraction must be between 0 and 1, got {val_fraction}.")
    cut = len(features) - round(len(features) * val_fraction)
    if cut <= 0 or cut >= len(features):
        raise InvalidValueError(
            f"val_fraction={val_fraction} leaves an empty part of {len(features)} rows."
        )
    return (features[:cut], labels[:cut]), (features[cut:], labels[cut:])
