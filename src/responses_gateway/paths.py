"""The gateway's one data directory: the default SQLite store, the seal key and the embedded model.

``serve --data-dir DIR`` wins, then ``RG_DATA_DIR``, then ``$XDG_DATA_HOME/responses-gateway``
(``~/.local/share/responses-gateway``). Everything the gateway writes by itself lives under it, so
moving it moves all of it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "LazyDirectory", "data_dir"]

DATA_DIR_ENV = "RG_DATA_DIR"


def data_dir(chosen: str | os.PathLike[str] | None = None) -> Path:
    """``chosen`` (``--data-dir``), else ``RG_DATA_DIR``, else the XDG default."""
    if chosen:
        return Path(chosen)
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "responses-gateway"


class LazyDirectory:
    """A directory under the data directory, made on first use: ``chosen()`` (called then), or when it
    gives None (a gateway run without a data directory, as in tests) a temporary one that
    :meth:`close` removes."""

    def __init__(self, chosen: Callable[[], Path | None], *, prefix: str) -> None:
        self._chosen = chosen
        self._prefix = prefix
        self._path: Path | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            chosen = self._chosen()
            if chosen is None:
                self._tmp = tempfile.TemporaryDirectory(prefix=self._prefix)
                chosen = Path(self._tmp.name)
            chosen.mkdir(parents=True, exist_ok=True)
            self._path = chosen
        return self._path

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._path = None
