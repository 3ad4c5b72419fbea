"""The compiled hot path: which modules mypyc compiles, what the same typed source needs to compile and
still run interpreted, and which build is running.

``COMPILED_MODULES`` are the modules a relayed event goes through that mypyc accepts
(``scripts/compile_hot_path.py`` compiles them; ``make run`` serves that build and ``make test`` runs
the suite on both; docs/architecture.md, "The compiled hot path"). ``mypyc_attr(native_class=False)``
marks a class mypyc must leave a normal Python class (a subclass of a built-in exception other than
``Exception``/``ValueError``, a class held by weak reference, a class with class-level settings that
interpreted code subclasses). mypyc reads the decorator at compile time; interpreted, it is
``mypy_extensions``' no-op when that is installed (mypy ships it) and an identity decorator when it is
not (a runtime install without the test extra).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from importlib.machinery import EXTENSION_SUFFIXES
from typing import TypeVar

__all__ = ["COMPILED_MODULES", "compiled_modules", "mypyc_attr"]

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy (and so mypy_extensions) not installed

    def mypyc_attr(*_attrs: str, **_kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls


# Not compiled, and why (docs/performance.md, "The whole per-event chain compiled", "The compiled hot
# path adopted"): providers/http1.py and providers/http_base.py (async generators, which this mypyc
# does not implement) and server/http_protocol.py (uvicorn's protocol subclass, subclassed again at run
# time). A compiled coroutine must not suspend inside an ``except`` block: ``drive`` did, and raised the
# handled CancelledError again after its handler (server/streaming.py, "Stopped").
COMPILED_MODULES: tuple[str, ...] = (
    "responses_gateway.protocol.sse",
    "responses_gateway.protocol.builder",
    "responses_gateway.protocol.events",
    "responses_gateway.protocol.json_field",
    "responses_gateway.protocol.json_holes",
    "responses_gateway.protocol.response",
    "responses_gateway.protocol.checker",
    "responses_gateway.protocol.chat_completions",
    "responses_gateway.providers.openai_chat",
    "responses_gateway.providers.openai_responses",
    "responses_gateway.server.streaming",
)


def compiled_modules() -> list[str]:
    """Which of ``COMPILED_MODULES`` this interpreter imports from compiled extension files (sorted):
    all of them on the compiled build, none on the interpreted one. Found without importing them."""
    suffixes = tuple(EXTENSION_SUFFIXES)
    found = []
    for name in COMPILED_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is not None and str(spec.origin).endswith(suffixes):
            found.append(name)
    return sorted(found)
