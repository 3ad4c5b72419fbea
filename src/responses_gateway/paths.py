"""The gateway's one data directory: the default SQLite store, the seal key and the embedded model.

``serve --data-dir DIR`` wins, then ``RG_DATA_DIR``, then ``$XDG_DATA_HOME/responses-gateway``
(``~/.local/share/responses-gateway``). Everything the gateway writes by itself lives under it, so
moving it moves all of it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "data_dir"]

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
