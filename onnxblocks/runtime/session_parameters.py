"""A training session's parameters and gradients: read, overwrite, count.

Part of :class:`~onnxblocks.runtime.session.TrainingSession` (see
:mod:`onnxblocks.runtime.session_core`). Values are checked against the parameter's
dtype and shape before anything is written; several are all checked before any is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxblocks._core.errors import InvalidValueError, StateError, UnknownNameError
from onnxblocks.runtime.session_core import SessionCore


class ParameterAccess(SessionCore):
    """Reading and writing a session's parameters and accumulated gradients."""

    def is_trainable(self, name: str) -> bool:
        """True when parameter ``name`` is trained (False: frozen)."""
        self._check_parameter(name)
        return self._backend.is_trainable(name)

    def get_parameter(self, name: str) -> np.ndarray:
        """A copy of parameter ``name`` as a numpy array.

        Raises:
            UnknownNameError: if there is no such parameter.
        """
        self._check_parameter(name)
        return self._backend.get_parameter(name)

    def parameters(self, trainable_only: bool = False) -> dict[str, np.ndarray]:
        """Copies of all parameters (or only the trainable ones), by name."""
        return {n: self.get_parameter(n) for n in self.parameter_names(trainable_only)}

    def gradients(self) -> dict[str, np.ndarray]:
        """Copies of the accumulated gradients of the trainable parameters, by name.

        After :meth:`optimizer_step` / :meth:`lazy_reset_grad` the buffers keep
        their old values until the next ``train_step`` resets them. Empty before
        the first ``train_step`` and, on the portable backend, after a fused
        :meth:`train_and_update` (which keeps no gradients).
        """
        out = {}
        for name in self.parameter_names(trainable_only=True):
            grad = self._backend.gradient(name)
            if grad is not None:
                out[name] = grad
        return out

    def set_gradients(self, values: Mapping[str, Any]) -> None:
        """Overwrite the accumulated gradients of trainable parameters before :meth:`optimizer_step`
        applies them.

        Raises:
            StateError: when no ``train_step`` ran since the gradients were last reset.
            UnknownNameError: if a name is not a trainable parameter.
            ValueError: if a dtype or shape differs from the parameter's.
        """
        if self._pending == 0:
            raise StateError(
                "set_gradients: no train_step ran since the gradients were last reset; run one "
                "first."
            )
        checked = {}
        for name, raw in values.items():
            self._check_parameter(name)
            if not self._backend.is_trainable(name):
                raise UnknownNameError(f"'{name}' is a frozen parameter: it has no gradient.")
            array = np.ascontiguousarray(raw)
            want_dtype, want_shape = self._backend.parameter_spec(name)
            if array.dtype != want_dtype or array.shape != want_shape:
                raise InvalidValueError(
                    f"the gradient of '{name}' is {want_dtype} with shape {want_shape}; got "
                    f"{array.dtype} with "
                    f"shape {array.shape}."
                )
            checked[name] = array
        self._backend.write_gradients(checked)

    def set_parameter(self, name: str, value: Any) -> None:
        """Overwrite parameter ``name`` with ``value`` (same dtype and shape).

        Raises:
            UnknownNameError: if there is no such parameter.
            ValueError: if dtype or shape differ.
        """
        self.set_parameters({name: value})

    def set_parameters(self, values: Mapping[str, Any]) -> None:
        """Overwrite several parameters; all are checked before any is written.

        Raises:
            UnknownNameError: if a name is not a parameter.
            ValueError: if a dtype or shape differs from the parameter's.
        """
        checked = {}
        for name, raw in values.items():
            self._check_parameter(name)
            array = np.ascontiguousarray(raw)
            want_dtype, want_shape = self._backend.parameter_spec(name)
            if array.dtype != want_dtype or array.shape != want_shape:
                raise InvalidValueError(
                    f"parameter '{name}' is {want_dtype} with shape {want_shape}; got "
                    f"{array.dtype} with shape "
                    f"{array.shape}. Pass an array of the parameter's dtype and shape."
                )
            checked[name] = array
        self._backend.write_parameters(checked)

    @property
    def num_parameters(self) -> int:
        """Number of trainable elements (as ONNX Runtime counts them)."""
        return self._backend.num_parameters()
