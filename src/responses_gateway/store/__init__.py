"""Persistence behind one interface: SQLite (embedded default) or PostgreSQL, optional Redis fan-out.

``open_store("sqlite:///data/gateway.db")`` or ``open_store("postgresql://…", redis_url="redis://…")``
returns a started :class:`Store`. See docs/store.md for the schema and the multi-instance design.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .db import Database, PostgresDatabase, SqliteDatabase
from .errors import (
    ConversationNotFound,
    FileNotFound,
    ItemNotFound,
    ItemReferenceNotFound,
    NotFound,
    PreviousResponseNotFound,
    ResponseNotFound,
    StoreError,
)
from .events import EventRecorder
from .live import LiveLog, LocalLiveLog, RedisLiveLog, SiblingLiveLog
from .rows import RUNNING, TERMINAL, TERMINAL_EVENTS, apply_include
from .store import Store

__all__ = [
    "RUNNING",
    "TERMINAL",
    "TERMINAL_EVENTS",
    "ConversationNotFound",
    "Database",
    "EventRecorder",
    "FileNotFound",
    "ItemNotFound",
    "ItemReferenceNotFound",
    "LiveLog",
    "LocalLiveLog",
    "NotFound",
    "PostgresDatabase",
    "PreviousResponseNotFound",
    "RedisLiveLog",
    "ResponseNotFound",
    "SiblingLiveLog",
    "SqliteDatabase",
    "Store",
    "StoreError",
    "apply_include",
    "database_for_url",
    "default_store_url",
    "open_store",
]


def default_store_url(data_dir: str | Path) -> str:
    """The embedded default: ``sqlite:///abs/data_dir/gateway.db`` (``sqlite://`` + the absolute path)."""
    return f"sqlite://{Path(data_dir).resolve() / 'gateway.db'}"


def database_for_url(url: str) -> Database:
    """``sqlite:///abs/path.db`` (``sqlite://rel/path.db`` is relative), ``sqlite://:memory:``, ``postgresql://…``."""
    if url.startswith("sqlite://"):
        # The path is taken literally after the scheme, so the common sqlite:///var/lib/x.db is absolute.
        path = url[len("sqlite://") :]
        if not path:
            raise ValueError(f"store URL {url!r}: expected sqlite:///path/to/file.db")
        return SqliteDatabase(":memory:" if path in (":memory:", "/:memory:") else path)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(url)
    raise ValueError(f"store URL {url!r}: must start with sqlite:// or postgresql://")


async def open_store(
    url: str, *, redis_url: str | None = None, siblings_dir: str | None = None, **options: Any
) -> Store:
    """A started Store for ``url``; ``redis_url`` (``redis://…``) enables cross-instance fan-out;
    without it, ``siblings_dir`` (``serve --workers N``) sends cancels to the sibling workers."""
    live: LiveLog
    if redis_url:
        live = RedisLiveLog(redis_url)
    elif siblings_dir:
        live = SiblingLiveLog(siblings_dir)
    else:
        live = LocalLiveLog()
    store = Store(database_for_url(url), live, **options)
    await store.start()
    return store
