"""Which build the suite runs on. ``make test`` runs it twice: on ``src/`` as written (the interpreted
fallback) and on the compiled hot path (``PYTHONPATH=build/compiled/src``, what ``make run`` serves),
with ``RG_TEST_BUILD`` naming the build; this makes sure each run imported the build it names."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from responses_gateway.protocol.native import COMPILED_MODULES, compiled_modules

BUILD = os.environ.get("RG_TEST_BUILD")


@pytest.mark.skipif(BUILD is None, reason="RG_TEST_BUILD unset (the suite run by hand, on either build)")
def test_the_suite_runs_on_the_build_it_names() -> None:
    assert BUILD in ("compiled", "interpreted")
    assert compiled_modules() == (sorted(COMPILED_MODULES) if BUILD == "compiled" else [])
    # What is imported is what was found.
    for name in COMPILED_MODULES:
        module = importlib.import_module(name)
        assert str(module.__file__).endswith(".py") == (BUILD == "interpreted"), module.__file__


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it holds, not descending into nested functions (their own bodies)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _walk(child)


_SUSPENDS = (ast.Await, ast.AsyncFor, ast.AsyncWith, ast.Yield, ast.YieldFrom)


def test_compiled_coroutines_avoid_what_mypyc_mishandled() -> None:
    """Two shapes the compiled ``drive`` got wrong (docs/performance.md, "The compiled hot path
    adopted"), kept out of every compiled module: an await inside an ``except`` block (suspended there,
    the handled CancelledError was raised again after the block), and a ``return`` inside a ``try``
    whose ``finally`` awaits (a TypeError on the WebSocket path)."""
    found = []
    for name in COMPILED_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        source = Path(spec.origin).parent / (name.rpartition(".")[2] + ".py")
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ExceptHandler):
                found += [
                    f"{name}:{n.lineno} suspends in an except block"
                    for n in _walk(node)
                    if isinstance(n, _SUSPENDS)
                ]
            if isinstance(node, ast.Try) and any(
                isinstance(n, _SUSPENDS) for f in node.finalbody for n in _walk(f)
            ):
                found += [
                    f"{name}:{n.lineno} returns before a finally that awaits"
                    for part in (node.body, node.handlers, node.orelse)
                    for stmt in part
                    for n in _walk(stmt)
                    if isinstance(n, ast.Return)
                ]
    assert not found, found
