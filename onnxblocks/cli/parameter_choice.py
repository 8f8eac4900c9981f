"""Which initializers ``onnxblocks artifacts`` trains and freezes: ``--requires-grad``,
``--frozen`` and ``--all-params`` patterns resolved against the model's initializers.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from onnxblocks.cli.errors import EXIT_USAGE, CliError

#: The ONNX element types a parameter can be trained in: FLOAT, FLOAT16, DOUBLE, BFLOAT16.
FLOAT_TYPES = {1, 10, 11, 16}


def select_parameters(
    initializers: Sequence[tuple[str, int]],
    requires_grad: Sequence[str],
    frozen: Sequence[str],
    all_params: bool,
) -> tuple[list[str], list[str]]:
    """Resolve ``--requires-grad``/``--frozen``/``--all-params`` into (trainable, frozen) names.

    Args:
        initializers: ``(name, onnx element type)`` of every initializer, in model order.
        requires_grad: Patterns of parameters to train.
        frozen: Patterns of parameters to freeze (they win over ``requires_grad``).
        all_params: Train every floating-point initializer.

    Raises:
        CliError: (exit 2) when neither ``requires_grad`` nor ``all_params`` is
            given; (exit 3) for a pattern that matches no initializer or only
            non-float ones.
    """
    if not requires_grad and not all_params:
        raise CliError(
            "choose the parameters to train: --requires-grad PATTERN... or --all-params "
            "(see 'onnxblocks artifacts --help')",
            EXIT_USAGE,
        )
    names = [n for n, _ in initializers]
    floats = [n for n, t in initializers if t in FLOAT_TYPES]
    frozen_names = match_all(frozen, names, floats, "--frozen")
    trainable = floats if all_params else match_all(requires_grad, names, floats, "--requires-grad")
    trainable = [n for n in trainable if n not in set(frozen_names)]
    return trainable, frozen_names


def match_all(
    patterns: Sequence[str], names: Sequence[str], floats: Sequence[str], option: str
) -> list[str]:
    """The float initializers ``patterns`` match, in model order of first match.

    Raises:
        CliError: (exit 3) for a pattern that matches nothing, or only non-float initializers.
    """
    from onnxblocks._core.errors import did_you_mean, preview

    chosen: dict[str, None] = {}
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise CliError(
                f"{option} {pattern!r} matches no initializer of the "
                f"model.{did_you_mean(pattern, names)} "
                f"Initializers: {preview(names)}."
            )
        usable = [n for n in hits if n in set(floats)]
        if not usable:
            raise CliError(
                f"{option} {pattern!r} matches only non-floating-point initializers "
                f"{preview(hits)}, which cannot "
                "be trained. Choose float parameters."
            )
        chosen.update(dict.fromkeys(usable))
    return list(chosen)
