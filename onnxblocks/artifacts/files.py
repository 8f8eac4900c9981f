"""Writing a set of artifact files: staged in a temporary directory, then moved into place.

A failure leaves no half-written artifacts, and files of an earlier run with the
same prefix that this run does not write are removed, so a directory never
mixes two runs. Also the ORT-format (``.ort``) copies of the models.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from onnxblocks._core.ort import onnxruntime

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def staging(directory: Path, artifact_names: Sequence[str]) -> Iterator[Path]:
    """Yield a temporary directory; on success move its files into ``directory``, on failure delete it.

    A missing ``directory`` is created by renaming the complete temporary
    directory into place; an existing one gets each file moved over
    (``os.replace``), and files of an earlier run that this run did not write
    (among ``artifact_names``: every file this prefix owns) are removed, so the
    directory never mixes two runs' artifacts.
    """
    exists = directory.is_dir()
    if directory.exists() and not exists:
        raise NotADirectoryError(f"artifact_directory '{directory}' exists and is not a directory.")
    parent = directory if exists else directory.parent
    created = None  # the top-most directory this call creates, removed again on failure
    if not exists:
        created = next((p for p in reversed(parent.parents) if not p.exists()), None) or (
            parent if not parent.exists() else None
        )
        parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".onnxblocks-artifacts-", dir=parent))
    try:
        yield stage
        if exists:
            written = {item.name for item in stage.iterdir()}
            for item in sorted(stage.iterdir()):
                os.replace(item, directory / item.name)
            stage.rmdir()
            for name in artifact_names:
                if name not in written and (directory / name).is_file():
                    logger.info("Removing %s, left by an earlier run.", directory / name)
                    (directory / name).unlink()
        else:
            os.replace(stage, directory)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def to_ort_format(model_path: Path, target: Path, custom_op_libraries: Sequence[str]) -> Path:
    """Write the ORT-format copy of ``model_path`` to ``target``.

    This is what ``convert_onnx_models_to_ort`` does, without torch.
    """
    ort = onnxruntime()

    options = ort.SessionOptions()
    options.optimized_model_filepath = os.fspath(target)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.add_session_config_entry("session.save_model_format", "ORT")
    for library in custom_op_libraries:
        options.register_custom_ops_library(library)
    ort.InferenceSession(
        os.fspath(model_path),
        sess_options=options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=["NchwcTransformer"],
    )
    return target
