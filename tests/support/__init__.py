"""Helpers shared by the test folders (importable as ``support``: pytest puts ``tests/`` on ``sys.path``).

* ``onnx_models``: a one-layer ONNX model and an ONNX Runtime runner (the ``conftest`` fixtures use them).
* ``models``: torch model families, exported three ways, and a training-API trainer.
* ``sweep``: the exporter-sweep cases (torch modules, exports, a cached ``generate_artifacts``).
* ``optim_oracle``: a tiny hand-built training model and the torch / formula oracles for optimizer steps.
* ``held_weights``: a model with a large constant that is not a parameter.
* ``reference``: the programs of the reference's own tests (``tests/compat/test_reference_*.py``), and their runners.
* ``runtime_support``: artifact directories and data for the runtime, checkpoint and CLI tests; directory listings.
* ``portable_linear``: a portable artifact directory written by hand; ``adamw_oracle``: torch AdamW on it.
* ``portable_env`` / ``portable_worker``: the cached Python 3.13 venv with stock onnxruntime, and its worker script.
* ``web_support`` / ``system_tools``: Node, npm and Chromium for the JavaScript client tests.
* ``imports``: the one reader of a package's imports (module level, in functions, under ``TYPE_CHECKING``), for
  ``tests/project/test_architecture.py`` and ``test_import_cycles.py``.
* ``numerics``: the one rule for comparing numbers with a reference; ``reference64``: torch models, Hugging Face
  families and inputs in float64, and the sum of |terms| of each parameter gradient (the floor's scale).
"""
