"""One error hierarchy: every error onnxblocks raises on purpose is an ``OnnxBlocksError``.

The scan reads every module of the package with ``ast`` and fails, naming file:line, on a
``raise`` of a builtin exception class outside the exemptions, and on an exception class
that does not derive from ``OnnxBlocksError``.
"""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import pytest

import onnxblocks
import onnxblocks.errors

PACKAGE = Path(onnxblocks.__file__).parent

#: Builtins a module may raise on purpose, and where.
#: - AttributeError from a module's or class's ``__getattr__`` (the attribute protocol);
#: - StopIteration / StopAsyncIteration (the iterator protocol), KeyboardInterrupt;
#: - NotImplementedError in an abstract method;
#: - AssertionError for internal invariants (a bug in onnxblocks, never a user's input).
EXEMPT_ANYWHERE = {"StopIteration", "StopAsyncIteration", "KeyboardInterrupt", "AssertionError"}
BUILTIN_EXCEPTIONS = {
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type)
    and issubclass(getattr(builtins, name), BaseException)
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_generated" not in p.parts)


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    return exc.id if isinstance(exc, ast.Name) else None


def _is_abstract(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    decorated = any(
        (isinstance(d, ast.Name) and d.id == "abstractmethod")
        or (isinstance(d, ast.Attribute) and d.attr == "abstractmethod")
        for d in function.decorator_list
    )
    body = [
        s
        for s in function.body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    return decorated or (len(body) == 1 and isinstance(body[0], ast.Raise))


def deliberate_builtin_raises(source: str, filename: str) -> list[str]:
    """``file:line name`` for each raise of a builtin exception outside the exemptions."""
    found: list[str] = []

    def visit(node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            )
            if isinstance(child, ast.Raise):
                name = _raised_name(child)
                if name in BUILTIN_EXCEPTIONS and name not in EXEMPT_ANYWHERE:
                    allowed = (
                        name == "AttributeError"
                        and function is not None
                        and function.name == "__getattr__"
                    ) or (
                        name == "NotImplementedError"
                        and function is not None
                        and _is_abstract(function)
                    )
                    if not allowed:
                        found.append(f"{filename}:{child.lineno} raise {name}")
            visit(child, inner)

    visit(ast.parse(source), None)
    return found


def foreign_exception_classes(source: str, filename: str) -> list[str]:
    """``file:line class`` for each exception class whose bases name a builtin exception but not an onnxblocks one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            bases = [
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            ]
            if node.name == "OnnxBlocksError":
                continue  # the root
            if any(b in BUILTIN_EXCEPTIONS for b in bases) and not any(
                b == "OnnxBlocksError" or (b.endswith("Error") and b not in BUILTIN_EXCEPTIONS)
                for b in bases
            ):
                found.append(f"{filename}:{node.lineno} class {node.name}({', '.join(bases)})")
    return found


def test_every_deliberate_raise_is_an_onnxblocks_error():
    found = []
    for path in _modules():
        found += deliberate_builtin_raises(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, (
        "raise an OnnxBlocksError subclass (onnxblocks/_core/errors.py) instead:\n"
        + "\n".join(found)
    )


def test_every_exception_class_derives_from_onnxblocks_error():
    found = []
    for path in _modules():
        found += foreign_exception_classes(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, "derive from OnnxBlocksError:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("def f():\n    raise ValueError('x')\n", ["m.py:2 raise ValueError"]),
        ("def f():\n    raise TypeError\n", ["m.py:2 raise TypeError"]),
        ("def __getattr__(name):\n    raise AttributeError(name)\n", []),
        ("def f():\n    raise AttributeError('x')\n", ["m.py:2 raise AttributeError"]),
        ("class A:\n    def f(self):\n        '''Doc.'''\n        raise NotImplementedError\n", []),
        (
            "def f():\n    x = 1\n    raise NotImplementedError\n",
            ["m.py:3 raise NotImplementedError"],
        ),
        ("def f(exc):\n    raise exc\n", []),
        ("def f():\n    try:\n        pass\n    except ValueError:\n        raise\n", []),
        ("def f():\n    raise InvalidValueError('x') from None\n", []),
    ],
)
def test_the_scan_sees_each_case(snippet, expected):
    assert deliberate_builtin_raises(snippet, "m.py") == expected


def test_the_class_scan_sees_foreign_classes():
    source = "class A(RuntimeError):\n    pass\nclass B(OnnxBlocksError, ValueError):\n    pass\nclass C(B):\n    pass\n"
    assert foreign_exception_classes(source, "m.py") == ["m.py:1 class A(RuntimeError)"]


def test_every_exception_class_is_public_and_catchable_as_its_builtin():
    classes = {
        name: obj
        for name, obj in vars(onnxblocks.errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException)
    }
    assert set(classes) == set(onnxblocks.errors.__all__)
    for name, cls in classes.items():
        assert issubclass(cls, onnxblocks.OnnxBlocksError), name
        assert getattr(onnxblocks, name) is cls, (
            f"onnxblocks.{name} is not exported at the top level"
        )
    assert issubclass(onnxblocks.errors.UnknownNameError, KeyError)
    assert issubclass(onnxblocks.errors.InvalidValueError, ValueError)
    assert issubclass(onnxblocks.errors.FileMissingError, FileNotFoundError)
    assert str(onnxblocks.errors.UnknownNameError("no 'x'")) == "no 'x'"  # not KeyError's quoting
