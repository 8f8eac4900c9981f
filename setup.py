"""Build hook: the wheel carries the JavaScript client (``js/``) as package data, ``onnxblocks/web/js/``.

Everything else is declared in ``pyproject.toml``. The client's sources live in
``js/`` (the npm package); this copies what ``onnxblocks demo --web`` serves (the
``package.json``, ``src/*.mjs``, ``demo/``) into the built package, so an installed
wheel finds them with :func:`onnxblocks.web.npm.js_dir`. The sdist carries ``js/``
(``MANIFEST.in``), so a wheel built from it has them too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: What the wheel carries from js/: (folder, pattern).
JS_FILES = (
    ("", "package.json"),
    ("", "README.md"),
    ("src", "*.mjs"),
    ("demo", "*.mjs"),
    ("demo", "*.js"),
    ("demo", "*.html"),
)


class BuildPyWithJs(build_py):
    """``build_py`` that also copies the JavaScript client into ``onnxblocks/web/js``."""

    def run(self) -> None:
        super().run()
        source = ROOT / "js"
        if not (source / "src").is_dir():  # e.g. a build from an sdist made without js/
            raise FileNotFoundError(f"the JavaScript client is missing at {source}: build from a checkout or an sdist")
        target = Path(self.build_lib) / "onnxblocks" / "web" / "js"
        for folder, pattern in JS_FILES:
            for path in sorted((source / folder).glob(pattern)):
                destination = target / folder / path.name
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, destination)


setup(cmdclass={"build_py": BuildPyWithJs})
