"""An exponential moving average of the weights during :func:`~onnxblocks.runtime.fit.fit`.

``WeightEMA(decay)`` is a callback that keeps, after every optimizer step, the
average torch's ``AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))``
keeps: the first update copies the trainable parameters, each later one moves the
average towards them, ``ema = lerp(ema, w, 1 - decay)`` (rounded once, as torch's
fused multiply-add). :meth:`WeightEMA.applied` puts the averaged weights into the
session for an evaluation or an export (``session.export_inference_model(...)`` inside it exports
them instead of the raw weights) and puts the raw ones back after.

In the checkpoint: during ``fit`` the callback attaches itself to the session
(``session.weight_ema``), and every checkpoint the session saves holds the average
(:mod:`onnxblocks.runtime.checkpoint_extras`: frozen tensors
``onnxblocks.extra/ema/<parameter>`` and the property ``onnxblocks.ema``). Loading the
checkpoint (``resume``, ``load_checkpoint``, ``TrainingSession(checkpoint=...)``)
restores the average into ``session.weight_ema``, a fresh ``WeightEMA`` callback of the
same decay takes it over, and ``session.export_inference_model(path, use_ema=True)``
exports it. :meth:`WeightEMA.save` and :meth:`WeightEMA.load` keep an ``.npz`` file
instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxblocks._core.errors import InvalidValueError
from onnxblocks.runtime.callbacks import Callback
from onnxblocks.runtime.checkpoint_extras import WeightAverage

if TYPE_CHECKING:
    from onnxblocks.runtime.fit_state import FitRun


class WeightEMA(WeightAverage, Callback):
    """The exponential moving average of the trainable weights, kept during ``fit`` (see the
    module docs).

    Args:
        decay: The average's decay per optimizer step, in ``[0, 1)``.

    Raises:
        InvalidValueError: for a decay outside ``[0, 1)``.
    """

    def on_train_begin(self, run: FitRun) -> None:
        """Attach to the session (its checkpoints hold the average); take over an average it
        restored.
        """
        restored = getattr(run.session, "weight_ema", None)
        if restored is not None and restored is not self and self.average is None:
            if restored.decay != self.decay:
                raise InvalidValueError(
                    f"The checkpoint holds a weight EMA of decay {restored.decay}, but this "
                    "WeightEMA has decay "
                    f"{self.decay}: pass WeightEMA({restored.decay}) to continue it."
                )
            self.average, self.updates = restored.average, restored.updates
        run.session.weight_ema = self

    def on_step_end(self, run: FitRun) -> None:
        self.update(run.session.parameters(trainable_only=True))


__all__ = ["WeightEMA"]
