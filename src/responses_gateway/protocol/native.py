"""What the same typed source needs to compile with mypyc (bench/compiled.py) and still run interpreted.

``mypyc_attr(native_class=False)`` marks a class mypyc must leave a normal Python class (a subclass of a
built-in exception other than ``Exception``/``ValueError``). mypyc reads the decorator at compile time;
interpreted, it is ``mypy_extensions``' no-op when that is installed (mypy ships it) and an identity
decorator when it is not (a runtime install without the test extra).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["mypyc_attr"]

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy (and so mypy_extensions) not installed

    def mypyc_attr(*_attrs: str, **_kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls
