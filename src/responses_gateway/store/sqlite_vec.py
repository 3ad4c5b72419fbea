"""sqlite-vec (the PyPI package's loadable extension) in Python's own ``sqlite3``.

Python's ``sqlite3`` is often built without ``enable_load_extension`` (pyenv's and Debian's are).
But its ``_sqlite3`` module links a shared SQLite library (Debian: the system's
``libsqlite3.so.0``), and that library's ``sqlite3_auto_extension`` registers an extension's entry
point for every connection opened afterwards. :func:`load` finds the library ``_sqlite3`` actually
mapped (``/proc/self/maps``, then the loader's name), checks it is the one ``sqlite3`` reports
(same version), registers ``sqlite3_vec_init`` there, and checks a fresh connection answers
``vec_version()``. There is one SQLite library in the process throughout (two copies on one file
would break SQLite's locking: sqlite.org/howtocorrupt.html §2.2.1).

It runs once per process, before the store's connection opens; anything that goes wrong returns
``None`` with the reason in :func:`failure` (logged once by the caller), never an exception.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import sqlite3
import threading
from pathlib import Path

__all__ = ["failure", "load"]

_lock = threading.Lock()
_state: dict[str, str | None] = {}


def _mapped_sqlite() -> list[str]:
    """Paths of the SQLite libraries mapped into this process (Linux), ``_sqlite3``'s among them."""
    import _sqlite3  # noqa: F401  (maps the library _sqlite3 links)

    found: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and "libsqlite3" in Path(parts[5].strip()).name:
                    path = parts[5].strip()
                    if path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def _load() -> str:
    """The loaded sqlite-vec's version; raises ``RuntimeError`` saying why not."""
    # The package's own ``loadable_path()`` is its directory's ``vec0``; found here without
    # importing it, because its ``__init__`` imports numpy (~11 MB, docs/performance.md, "What a
    # process holds at start").
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the sqlite-vec package is not installed")
    base = str(Path(next(iter(spec.submodule_search_locations))) / "vec0")
    candidates = _mapped_sqlite()
    if not candidates:
        name = ctypes.util.find_library("sqlite3")
        if name is None:
            raise RuntimeError("no shared SQLite library found (is _sqlite3 statically linked?)")
        candidates = [name]
    lib = None
    for path in candidates:
        try:
            found = ctypes.CDLL(path)
            found.sqlite3_libversion.restype = ctypes.c_char_p
            version = found.sqlite3_libversion().decode()
        except (OSError, AttributeError):
            continue
        if version == sqlite3.sqlite_version:
            lib = found
            break
    if lib is None:
        raise RuntimeError(
            f"no shared SQLite library in this process is sqlite3's own ({sqlite3.sqlite_version}); "
            "_sqlite3 may be statically linked"
        )
    found_ext = [base + suffix for suffix in (".so", ".dylib", ".dll") if Path(base + suffix).exists()]
    if not found_ext:
        raise RuntimeError(f"sqlite-vec's loadable library is missing ({base}.*)")
    try:
        ext = ctypes.CDLL(found_ext[0])
        entry = ctypes.cast(ext.sqlite3_vec_init, ctypes.c_void_p)
    except (OSError, AttributeError) as exc:
        raise RuntimeError(f"sqlite-vec's library cannot be loaded: {exc}") from None
    lib.sqlite3_auto_extension.argtypes = [ctypes.c_void_p]
    lib.sqlite3_auto_extension.restype = ctypes.c_int
    if lib.sqlite3_auto_extension(entry) != 0:
        raise RuntimeError("sqlite3_auto_extension refused sqlite-vec")
    conn = sqlite3.connect(":memory:")
    try:
        return str(conn.execute("SELECT vec_version()").fetchone()[0])
    except sqlite3.Error as exc:
        raise RuntimeError(f"sqlite-vec registered but not answering: {exc}") from None
    finally:
        conn.close()


def load() -> str | None:
    """sqlite-vec's version once it is in every new ``sqlite3`` connection, or None (:func:`failure`)."""
    with _lock:
        if "version" not in _state:
            try:
                _state["version"], _state["failure"] = _load(), None
            except RuntimeError as exc:
                _state["version"], _state["failure"] = None, str(exc)
        return _state["version"]


def failure() -> str | None:
    """Why :func:`load` returned None (None before it ran or when it worked)."""
    return _state.get("failure")
