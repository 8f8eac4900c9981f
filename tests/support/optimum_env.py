"""Hugging Face Optimum exports of tiny random-init models, made by the tests in a venv of their own.

optimum-onnx 0.1.0 needs ``optimum~=2.1.0`` and ``transformers<4.58``, while the main environment
has transformers 5, so the exporter lives in a cached venv (``~/.cache/onnxblocks-test/optimum-<hash>``,
the hash of what it installs and of the interpreter), built once under
:func:`support.cache_lock.cache_lock` in a staging directory renamed into place. torch is the
project's pin (``pyproject.toml``'s ``torch`` extra); pip takes the CPU wheel from its configured
find-links or index (``pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu``
where it would take a CUDA one).

:func:`optimum_export` writes a Transformers.js hub folder (``config.json``, tokenizer files,
``generation_config.json`` for language models, ``model.safetensors``, ``onnx/model.onnx``) for one
(family, with_past, task), cached the same way. Nothing is downloaded (``HF_HUB_OFFLINE=1``). A
failure raises :class:`OptimumEnvError` with the command that reproduces it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import tomllib

from support import venvs
from support.cache_lock import cache_dir

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parent.parent
WORKER = SUPPORT / "optimum_worker.py"

#: The families and tasks :func:`optimum_export` makes.
FAMILIES = ("llama", "qwen2", "gpt2", "bert")
TASKS = ("causal-lm", "sequence-classification", "token-classification", "masked-lm")


class OptimumEnvError(RuntimeError):
    """The optimum venv or an export cannot be made; the message says how to reproduce it."""


_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _torch_requirement() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["torch"]
    return next(r for r in extra if r.replace(" ", "").startswith("torch=="))


def requirements() -> list[str]:
    """What the optimum venv installs: the exporter, its pinned companions and the project's torch."""
    return [
        "optimum-onnx==0.1.0",
        "optimum~=2.1.0",
        "transformers<4.58",
        _torch_requirement(),
        "onnx>=1.16",
        # the exporter checks its dynamic axes with stock onnxruntime
        "onnxruntime>=1.20",
        "tokenizers",
    ]


def _key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part + b"\0")
    return digest.hexdigest()[:16]


def _run(cmd: list[str], what: str, *, stdin: str | None = None, timeout: int = 1800) -> str:
    return venvs.run(cmd, what, OptimumEnvError, stdin=stdin, timeout=timeout, env=_OFFLINE)


def _base_python() -> str:
    """The interpreter the venv is made from: this one's base (a venv's own python makes a venv too)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_optimum_python() -> Path:
    """The Python of the cached optimum venv, built on first use (minutes: torch and transformers).

    Raises:
        OptimumEnvError: when the venv cannot be built; the message has the pip command.
    """
    wanted = requirements()
    interpreter = _base_python()
    key = _key(json.dumps(wanted).encode(), interpreter.encode(), sys.version.encode())
    venv = cache_dir() / f"optimum-{key}"
    by_hand = (
        f"to build it by hand: python -m venv {venv} && {venv}/bin/python -m pip install "
        + " ".join(repr(w) for w in wanted)
        + f" && touch {venv}/ready"
    )
    return venvs.cached_venv(
        venv,
        interpreter,
        wanted,
        "import optimum.exporters.onnx, transformers, torch, tokenizers",
        what=f"optimum ({by_hand})",
        error=OptimumEnvError,
        marker={"requirements": wanted},
    )


def optimum_export(family: str, *, with_past: bool = False, task: str = "causal-lm") -> Path:
    """A Transformers.js hub folder of a tiny random-init ``family`` model exported for ``task``.

    ``family`` is one of :data:`FAMILIES`, ``task`` one of :data:`TASKS` (BERT has no causal LM,
    and only causal LMs have a past). The folder is cached; callers must copy it before writing.

    Raises:
        OptimumEnvError: when the venv or the export fails, with the command to reproduce it.
        ValueError: for an unknown family or task, or a combination optimum cannot export.
    """
    if family not in FAMILIES or task not in TASKS:
        raise ValueError(f"optimum_export({family!r}, task={task!r}): use {FAMILIES} and {TASKS}")
    if with_past and task != "causal-lm":
        raise ValueError(f"only causal-lm exports have a past, not {task!r}")
    if (family == "bert" and task == "causal-lm") or (family != "bert" and task == "masked-lm"):
        raise ValueError(f"{family} cannot be exported for {task!r}")
    python = ensure_optimum_python()
    request = {"family": family, "task": task, "with_past": with_past}
    key = _key(
        json.dumps(request, sort_keys=True).encode(), WORKER.read_bytes(), str(python).encode()
    )
    name = f"{family}-{task}-{'past' if with_past else 'nopast'}-{key}"

    def export(staging: Path) -> str:
        payload = json.dumps({**request, "out": os.fspath(staging / "hub")})
        _run([os.fspath(python), os.fspath(WORKER)], f"Exporting {name}", stdin=payload)
        return payload

    folder = cache_dir() / "optimum-exports" / name
    return venvs.cached_dir(folder, export, lock=f"optimum-export-{name}") / "hub"


if __name__ == "__main__":
    print(ensure_optimum_python())
    for family, past, task in [("llama", False, "causal-lm"), ("llama", True, "causal-lm")]:
        print(optimum_export(family, with_past=past, task=task))
    sys.exit(0)
