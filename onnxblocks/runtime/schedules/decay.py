r"""Schedules with ``torch.optim.lr_scheduler``'s names, arguments and numbers.

Each is a :class:`~onnxblocks.runtime.schedules.Schedule`: a pure function of ``t``, the optimizer
steps already taken, giving the learning rate of update ``t + 1`` (what torch's
``scheduler.get_last_lr()`` holds after ``t`` calls of ``scheduler.step()``). Where torch takes an
optimizer, these take its ``lr`` (``base_lr``); parameter groups keep their ratio to it
(docs/optim.md), which is how torch's schedulers scale each group. The sequences equal torch's
within 1e-12 relative over three times ``T_max`` / ``step_size`` / ``total_iters``
(``tests/optim/test_lr_schedulers.py``). Past the end of a schedule they continue as torch's do
(``CosineAnnealingLR`` keeps following the cosine up again; the others hold or keep decaying),
except :class:`OneCycleLR`, which holds its final rate where torch raises.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

from onnxblocks._core import hyperparams as _hyper
from onnxblocks._core.errors import InvalidTypeError, InvalidValueError
from onnxblocks.runtime.schedules.schedule import Schedule, _count


class _TorchSchedule(Schedule):
    """A schedule of torch's family: no warmup phase of its own (use :class:`SequentialLR` with
    :class:`LinearLR`).
    """

    def __init__(self, base_lr: float) -> None:
        super().__init__(base_lr, 0)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        del state["warmup_steps"]
        return state


class LinearLR(_TorchSchedule):
    """``torch.optim.lr_scheduler.LinearLR``: the factor goes linearly from ``start_factor`` to
    ``end_factor``.
    """

    kind = "LinearLR"

    def __init__(
        self,
        base_lr: float,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
    ) -> None:
        super().__init__(base_lr)
        if not 0 < _hyper.nonnegative(start_factor, "LinearLR: start_factor") <= 1:
            raise InvalidValueError(
                f"LinearLR: start_factor must be in (0, 1], got {start_factor!r}."
            )
        if not 0 <= _hyper.nonnegative(end_factor, "LinearLR: end_factor") <= 1:
            raise InvalidValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor!r}.")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = _count("LinearLR", "total_iters", total_iters)

    def _after_warmup(self, step: int) -> float:
        done = min(step, self.total_iters)
        return self.base_lr * (
            self.start_factor + (self.end_factor - self.start_factor) * done / self.total_iters
        )


class CosineAnnealingLR(_TorchSchedule):
    """``torch.optim.lr_scheduler.CosineAnnealingLR``: ``eta_min + (b - eta_min) * (1 + cos(pi * t /
    T_max)) / 2``.

    As torch's, it keeps following the cosine past ``T_max`` (back up to ``base_lr`` at ``2 *
    T_max``).
    """

    kind = "CosineAnnealingLR"

    def __init__(self, base_lr: float, T_max: int, eta_min: float = 0.0) -> None:  # torch's name
        super().__init__(base_lr)
        self.T_max = _count("CosineAnnealingLR", "T_max", T_max)
        self.eta_min = _hyper.learning_rate(eta_min, "CosineAnnealingLR: eta_min")

    def _after_warmup(self, step: int) -> float:
        return (
            self.eta_min
            + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * step / self.T_max)) / 2
        )


class StepLR(_TorchSchedule):
    """``torch.optim.lr_scheduler.StepLR``: ``base_lr * gamma ** (t // step_size)``."""

    kind = "StepLR"

    def __init__(self, base_lr: float, step_size: int, gamma: float = 0.1) -> None:
        super().__init__(base_lr)
        name = type(self).__name__  # StepSchedule's errors name StepSchedule
        self.step_size = _count(name, "step_size", step_size)
        self.gamma = _hyper.nonnegative(gamma, f"{name}: gamma")

    def _after_warmup(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.step_size)


class MultiStepLR(_TorchSchedule):
    """``torch.optim.lr_scheduler.MultiStepLR``: ``base_lr * gamma ** (milestones passed)``."""

    kind = "MultiStepLR"

    def __init__(self, base_lr: float, milestones: Sequence[int], gamma: float = 0.1) -> None:
        super().__init__(base_lr)
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence):
            raise InvalidTypeError(
                f"MultiStepLR: milestones must be a list of ints, not {type(milestones).__name__}."
            )
        self.milestones = sorted(_count("MultiStepLR", "milestones[]", m, 0) for m in milestones)
        self.gamma = _hyper.nonnegative(gamma, "MultiStepLR: gamma")

    def _after_warmup(self, step: int) -> float:
        return self.base_lr * self.gamma ** bisect_right(self.milestones, step)


class ExponentialLR(_TorchSchedule):
    """``torch.optim.lr_scheduler.ExponentialLR``: ``base_lr * gamma ** t``."""

    kind = "ExponentialLR"

    def __init__(self, base_lr: float, gamma: float) -> None:
        super().__init__(base_lr)
        self.gamma = _hyper.nonnegative(gamma, "ExponentialLR: gamma")

    def _after_warmup(self, step: int) -> float:
        return self.base_lr * self.gamma**step


class OneCycleLR(_TorchSchedule):
    """``torch.optim.lr_scheduler.OneCycleLR`` (the learning rate; momentum is not cycled).

    Warms up from ``max_lr / div_factor`` to ``max_lr`` over ``pct_start`` of
    ``total_steps``, then anneals to ``max_lr / div_factor / final_div_factor``
    (``three_phase``: back to the initial rate first). It schedules ``total_steps``
    updates; past them it holds the last rate, where torch raises.
    """

    kind = "OneCycleLR"

    def __init__(
        self,
        max_lr: float,
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
    ) -> None:
        super().__init__(max_lr)
        self.total_steps = _count("OneCycleLR", "total_steps", total_steps)
        if not 0 <= _hyper.nonnegative(pct_start, "OneCycleLR: pct_start") <= 1:
            raise InvalidValueError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start!r}.")
        if anneal_strategy not in ("cos", "linear"):
            raise InvalidValueError(
                f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}."
            )
        self.pct_start, self.anneal_strategy = float(pct_start), anneal_strategy
        self.div_factor = _hyper.nonnegative(div_factor, "OneCycleLR: div_factor")
        self.final_div_factor = _hyper.nonnegative(final_div_factor, "OneCycleLR: final_div_factor")
        if not self.div_factor or not self.final_div_factor:
            raise InvalidValueError("OneCycleLR: div_factor and final_div_factor must be > 0.")
        self.three_phase = bool(three_phase)

    def _phases(self) -> list[tuple[float, float, float]]:
        """``(end_step, start_lr, end_lr)`` per phase, as torch lays them out."""
        initial = self.base_lr / self.div_factor
        final = initial / self.final_div_factor
        up = float(self.pct_start * self.total_steps) - 1
        if self.three_phase:
            return [
                (up, initial, self.base_lr),
                (float(2 * self.pct_start * self.total_steps) - 2, self.base_lr, initial),
                (self.total_steps - 1, initial, final),
            ]
        return [(up, initial, self.base_lr), (self.total_steps - 1, self.base_lr, final)]

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _after_warmup(self, step: int) -> float:
        step = min(
            step, self.total_steps - 1
        )  # torch refuses an update past total_steps: hold the last rate
        phases, start_step = self._phases(), 0.0
        for i, (end_step, start_lr, end_lr) in enumerate(phases):
            if step <= end_step or i == len(phases) - 1:
                return self._anneal(start_lr, end_lr, (step - start_step) / (end_step - start_step))
            start_step = end_step
        raise AssertionError("unreachable: the last phase always answers")

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["max_lr"] = state.pop("base_lr")
        return state


class LambdaLR(_TorchSchedule):
    """``torch.optim.lr_scheduler.LambdaLR``: ``base_lr * lr_lambda(t)``.

    Its function is Python code, so a checkpoint records its name only: pass the
    schedule again when resuming (``fit(..., scheduler=...)``).
    """

    kind = "LambdaLR"

    def __init__(self, base_lr: float, lr_lambda: Callable[[int], float]) -> None:
        super().__init__(base_lr)
        if not callable(lr_lambda):
            raise InvalidTypeError(
                f"LambdaLR: lr_lambda must be a function of the step, not {lr_lambda!r:.60}."
            )
        self._lr_lambda = lr_lambda

    def _after_warmup(self, step: int) -> float:
        return self.base_lr * float(self._lr_lambda(step))

    def state_dict(self) -> dict[str, Any]:
        name = getattr(self._lr_lambda, "__qualname__", repr(self._lr_lambda))
        return {**super().state_dict(), "lr_lambda": name}
