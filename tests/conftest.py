"""Shared fixtures (small models, an ONNX Runtime runner) and how a run is set up; helpers live in ``support/``.

Markers. The fast subset is ``pytest -m "not slow and not node and not browser and not py313"``; the
README's command (no ``-m``) runs everything. These four markers are set in one place, the table
``MARKS`` of ``support/markers.py``, which :func:`pytest_collection_modifyitems` applies; test modules
never set them (no ``pytestmark``, decorators or ``pytest.param(marks=...)`` of these four).

Workers. ``pyproject.toml`` runs pytest-xdist (``-n auto --dist loadfile``): a run of directories (the
whole suite, a package) gets one worker per CPU; a run that names files or tests runs in this process
(:func:`pytest_xdist_auto_num_workers`); ``-n 0`` always runs in-process (for ``--pdb``, debugging;
``-p no:xdist`` cannot be used, the addopts name xdist's options), ``-n N`` forces N workers. With
several workers:

* each worker's ONNX Runtime sessions and torch get ``CPUs // workers`` threads
  (``ONNXBLOCKS_ORT_THREADS``, ``OMP_NUM_THREADS``; either set by hand wins), so two workers on two cores
  do not fight over them;
* the tests of a module run on one worker (``loadfile``), so its module-scoped fixtures are built once
  (``xdist_group`` marks would do it per group, but pytest-xdist 3.8 cannot set them on pytest 9's node
  ids: the tests of a group were spread over the workers);
* the longest modules (``_LONGEST``), then the other modules with slow, Node, browser or Python 3.13
  tests, are handed out first and the quick ones fill the end, so no worker is left running a long
  module alone at the end (``--no-loadscope-reorder`` keeps this order);
* the caches the tests build on first use (3.13 venvs, npm packages, apt-get installs) are built by one
  process while the others wait (``support/cache_lock.py``), in the one shape of ``support/venvs.py``.
"""

from __future__ import annotations

import os
import sys
import warnings

import onnx
import pytest
from support.markers import SELECTION_MARKERS, MarkTable
from support.onnx_models import make_linear_model, run_model
from support.ort_threads import install as install_ort_threads

#: ``training_dir`` (the optimizer oracle's training model), for the optimizer and checkpoint tests.
pytest_plugins = ["support.optim_oracle"]


def _cpus() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _share_cores() -> None:
    """Under pytest-xdist, give each worker's ONNX Runtime sessions and torch its share of the CPUs."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2:
        return
    share = str(max(1, _cpus() // workers))
    os.environ.setdefault("ONNXBLOCKS_ORT_THREADS", share)
    os.environ.setdefault("OMP_NUM_THREADS", share)  # torch here and in subprocesses
    if "torch" in sys.modules:  # imported before this file: its thread pool is sized already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_cores()
install_ort_threads()  # ONNXBLOCKS_ORT_THREADS=N: every session the tests open gets N intra-op threads


@pytest.fixture
def ort_run():
    """The ONNX Runtime runner: ``ort_run(model, feeds) -> list of outputs``."""
    return run_model


@pytest.fixture
def linear_model() -> onnx.ModelProto:
    """A fresh one-layer float model (``x`` -> ``y``)."""
    return make_linear_model()


@pytest.fixture(scope="session")
def portable_python():
    """The Python of a cached 3.13 venv with stock onnxruntime (see ``tests/support/portable_env.py``), built once.

    Fails, never skips, when CPython 3.13 or the packages cannot be had.
    """
    from support.portable_env import PortableEnvError, ensure_python313

    try:
        return ensure_python313()
    except PortableEnvError as exc:
        pytest.fail(str(exc))


#: Markers a distributed run hands out first (long tests, or tests that start other programs).
_FIRST = ("slow", "node", "browser", "py313")
#: The longest modules (``--durations``, 2 loaded cores: 40 s to 3 min each), longest first: a worker
#: takes the next module when it is free, so the long ones start first and the quick ones fill the end.
_LONGEST = (
    "tests/federated/test_browser_clients.py",
    "tests/losses/test_loss_grid.py",
    "tests/federated/test_simulation.py",
    "tests/federated/test_deployment.py",
    "tests/federated/test_cli_federate.py",
    "tests/portable/test_portable_hf_sweep.py",
    "tests/torch/test_torch_module_api.py",
    "tests/federated/test_faults_deployment.py",
    "tests/families/test_exporter_sweep.py",
    "tests/web/test_web_browser.py",
    "tests/project/test_notebooks.py",
    "tests/runtime/test_export.py",
    "tests/portable/test_portable_runtime_families.py",
    "tests/torch/test_torch_differential.py",
    "tests/federated/test_hetero_clients.py",
    "tests/torch/test_torch_gradient_rewrites.py",
    "tests/federated/test_js_clients.py",
    "tests/torch/test_einsum_memory.py",
    "tests/torch/test_torch_extrema.py",
    "tests/federated/test_lora_federated.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU for a run of directories; in-process for named files or tests.

    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` (pytest-xdist's own variable) still sets the count.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist reads it
    args = [arg for arg in config.args if not arg.startswith("-")]
    if args and all("::" in arg or os.path.isfile(arg) for arg in args):
        return 0
    return _cpus()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_configure(config):
    """The controller finds CPython 3.13 once and hands its path to the workers
    (``ONNXBLOCKS_PYTHON313``), so a worker never searches PATH and pyenv on its own."""
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("ONNXBLOCKS_PYTHON313"):
        return
    from support.portable_env import PortableEnvError, find_python313

    try:
        found = os.fspath(find_python313())
        os.environ["ONNXBLOCKS_PYTHON313"] = os.environ["ONNXBLOCKS_PYTHON313_PROBED"] = found
    except PortableEnvError:
        pass  # the tests that need it fail with the search's own error


def pytest_collection_modifyitems(config, items):
    """Set the selection markers of ``support/markers.py``; order the modules for the workers."""
    table = MarkTable()
    unmarked_py313 = []
    elsewhere = []
    for item in items:
        if any(item.get_closest_marker(name) for name in SELECTION_MARKERS):
            elsewhere.append(item.nodeid)  # a decorator or pytestmark: kept, and warned about below
        for name in table.markers(item.nodeid):
            item.add_marker(name)
        uses_313 = "portable_python" in getattr(item, "fixturenames", ())
        if uses_313 and not item.get_closest_marker("py313"):
            item.add_marker("py313")  # the fast subset must not need Python 3.13: warned below
            unmarked_py313.append(item.nodeid)
    if elsewhere:
        warnings.warn(
            f"{len(elsewhere)} tests get slow/node/browser/py313 from a decorator or pytestmark; set "
            f"them in tests/support/markers.py, the one place for them: {elsewhere[:5]}",
            stacklevel=1,
        )
    if unmarked_py313:
        warnings.warn(
            f"{len(unmarked_py313)} tests use portable_python but are not marked py313 in "
            f"tests/support/markers.py (marked now; add them there): {unmarked_py313[:5]}",
            stacklevel=1,
        )
    named = [arg for arg in config.args if not arg.startswith("-")]
    whole_suite = not named or named == list(config.getini("testpaths"))
    if whole_suite and (stale := table.unused()):
        warnings.warn(
            f"tests/support/markers.py: {len(stale)} keys match no test (renamed or removed? "
            f"update the table): {stale[:5]}",
            stacklevel=1,
        )
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker sorts alike
        # a module moves as a whole, its tests in their order (a later one may read an earlier one's files)
        first = {
            item.nodeid.split("::")[0]
            for item in items
            if any(item.get_closest_marker(name) for name in _FIRST)
        }
        rank = {module: i for i, module in enumerate(_LONGEST)}

        def order(item) -> tuple[int, int]:
            module = item.nodeid.split("::")[0]
            return (0, rank[module]) if module in rank else (1 if module in first else 2, 0)

        items.sort(key=order)
