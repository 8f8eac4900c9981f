"""A training session's checkpoints: its properties and the files it saves.

Part of :class:`~onnxblocks.runtime.session.TrainingSession` (see
:mod:`onnxblocks.runtime.session_core`). A checkpoint holds the parameters, the
optimizer state, the step counter and the properties (encoded by
:mod:`onnxblocks.runtime.properties`), and the weight average when the session holds
one (:mod:`onnxblocks.runtime.checkpoint_extras`). It is written next to its
destination and renamed into place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnxblocks._core.contracts import STEP_PROPERTY
from onnxblocks.runtime import guards as _guards
from onnxblocks.runtime import properties as _props
from onnxblocks.runtime.checkpoint_extras import (
    EMA_PREFIX,
    EMA_PROPERTY,
    average_property,
    write_average,
)
from onnxblocks.runtime.session_core import SessionCore


class CheckpointAccess(SessionCore):
    """A session's properties and the checkpoints it saves."""

    def _raw_properties(self) -> dict[str, Any]:
        return {n: _props.decode(v) for n, v in self._backend.properties().items()}

    @property
    def properties(self) -> dict[str, Any]:
        """User properties of the current state (those saved with ``save_checkpoint``), decoded.

        Keys starting with ``"onnxblocks."`` are the runtime's own (step counter,
        data-loader and scheduler state); they are included.
        """
        return self._raw_properties()

    def save_checkpoint(
        self,
        path: str | os.PathLike,
        include_optimizer_state: bool = True,
        properties: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write parameters, optimizer state, step counter and ``properties`` to ``path``.

        The file is written next to its destination and renamed into place, so an
        interrupted save never leaves a half-written checkpoint.

        Args:
            path: Destination file.
            include_optimizer_state: Save the optimizer's moments and step too, so
                that training resumes exactly.
            properties: Extra values to store; ints, strs and float32-exact floats
                natively, anything else JSON-encodable exactly (see
                :mod:`onnxblocks.runtime.properties`).

        Returns:
            The checkpoint path.

        Raises:
            ValueError: for a property name with the reserved ``onnxblocks.`` prefix.
            TypeError: for a property value that cannot be stored.
        """
        user = dict(properties or {})
        _props.check_names(user)
        return self._save(_guards.as_path(path, "path"), include_optimizer_state, user)

    def _save(self, path: Path, include_optimizer_state: bool, values: Mapping[str, Any]) -> Path:
        encoded = {name: _props.encode(value, name) for name, value in values.items()}
        encoded[STEP_PROPERTY] = self.step
        ema = average_property(self.weight_ema)
        if ema is not None or EMA_PROPERTY in self._backend.properties():
            encoded[EMA_PROPERTY] = _props.encode(ema, EMA_PROPERTY)
        for name, value in encoded.items():
            self._backend.set_property(name, value)
        stale = any(n.startswith(EMA_PREFIX) for n in self._backend.parameter_names())
        with _guards.checkpoint_output(
            path
        ) as temp:  # with <temp>.data, if any, replaces the old pair at once
            self._backend.save(temp, include_optimizer_state)
            if (
                ema is not None or stale
            ):  # the average as frozen tensors ONNX Runtime loads and ignores
                write_average(temp, self.weight_ema)
        return path

    def set_properties(self, properties: Mapping[str, Any]) -> None:
        """Store properties in the in-memory state (saved with the next checkpoint)."""
        _props.check_names(properties)
        for name, value in properties.items():
            self._backend.set_property(name, _props.encode(value, name))
