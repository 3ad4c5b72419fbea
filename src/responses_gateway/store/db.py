"""The two SQL back ends behind one tiny async interface: transactions of ``?``-placeholder statements.

Everything above this module is written once. SQLite runs on one connection in one dedicated thread
(the embedded default: a file, WAL, no server); PostgreSQL runs on an asyncpg pool. Values are plain
``str``/``int``/``float``/``None``; JSON travels as text so both dialects store it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import sqlite_vec

if TYPE_CHECKING:
    import asyncpg

__all__ = ["Database", "PostgresDatabase", "Row", "SqliteDatabase", "Tx"]

Row = tuple[Any, ...]
T = TypeVar("T")


class Tx(ABC):
    """One open transaction."""

    @abstractmethod
    async def execute(self, sql: str, *args: Any) -> int:
        """Run one statement; the number of rows it changed."""

    @abstractmethod
    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per row of arguments."""

    @abstractmethod
    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """Rows of a query."""

    async def fetchone(self, sql: str, *args: Any) -> Row | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def write(self, sql: str, *args: Any) -> None:
        """Run a statement whose result is not needed. It may be sent with the transaction's next
        statement or its commit (SQLite: one trip to the database thread for several statements); an
        error it raises then surfaces there, inside the same transaction, which is rolled back."""
        await self.execute(sql, *args)

    async def writemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """:meth:`executemany` that may be deferred like :meth:`write`."""
        await self.executemany(sql, rows)

    async def write_counted(self, sql: str, *args: Any, into: list[int]) -> None:
        """:meth:`write` whose number of changed rows is appended to ``into`` once it has run: at the
        latest when the transaction commits (read ``into`` after the ``async with``)."""
        into.append(await self.execute(sql, *args))


class Database(ABC):
    """A connection source; ``dialect`` is ``sqlite`` or ``postgresql``."""

    dialect: str
    # Appended to a SELECT that must lock the rows it reads until commit (SQLite locks the whole file).
    for_update: str = ""

    @abstractmethod
    def transaction(self, *, first: bool = False) -> Any:
        """``async with db.transaction() as tx``: commit on success, roll back on an exception.

        ``first``: where transactions wait for one another (SQLite's one connection), this one goes
        ahead of the waiting ones that did not ask (it still waits for the one in flight). For writes
        a request is waiting on before its first event; nothing else may rely on their order.
        """

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...


# ------------------------------------------------------------------------------------------ SQLite
# What a deferred statement is (``_SqliteTx._queued``): one run, one run per row, one run counted.
_ONE, _MANY, _COUNTED = 0, 1, 2


class _SqliteTx(Tx):
    """Statements go to the database thread in as few trips as possible: ``BEGIN IMMEDIATE`` and the
    deferred writes travel with the next statement that needs an answer, or with the ``COMMIT``. Each
    trip costs the event loop a thread hand-off and a wake-up, under load a full loop turn."""

    __slots__ = ("_db", "_queued")

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db
        # IMMEDIATE takes the write lock up front, so two processes on one file never deadlock
        # upgrading read locks.
        self._queued: list[tuple[int, str, Any]] = [(_ONE, "BEGIN IMMEDIATE", ())]

    def _trip(self, fn: Callable[[sqlite3.Connection], T]) -> Awaitable[T]:
        queued, self._queued = self._queued, []
        if not queued:
            return self._db.call(fn)

        def work(conn: sqlite3.Connection) -> T:
            for kind, sql, args in queued:
                if kind == _ONE:
                    conn.execute(sql, args)
                elif kind == _MANY:
                    conn.executemany(sql, args)
                else:
                    values, into = args
                    into.append(conn.execute(sql, values).rowcount)
            return fn(conn)

        return self._db.call(work)

    async def execute(self, sql: str, *args: Any) -> int:
        return int(await self._trip(lambda c: c.execute(sql, args).rowcount))

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._trip(lambda c: c.executemany(sql, rows))

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        rows: list[Row] = await self._trip(lambda c: c.execute(sql, args).fetchall())
        return rows

    async def write(self, sql: str, *args: Any) -> None:
        self._queued.append((_ONE, sql, args))

    async def writemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._queued.append((_MANY, sql, rows))

    async def write_counted(self, sql: str, *args: Any, into: list[int]) -> None:
        self._queued.append((_COUNTED, sql, (args, into)))

    async def commit(self) -> None:
        await self._trip(lambda c: c.execute("COMMIT"))


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _use_wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode (persistent: a file already in it needs nothing). Turning it on
    takes an exclusive lock, for which SQLite does not wait on its busy handler when another
    connection is reading: the workers of ``serve --workers N`` opening a new file together could
    fail start-up with "database is locked". Such a refusal is retried for up to 30 s."""
    deadline = time.monotonic() + 30.0
    while True:
        try:
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _database_thread() -> None:
    """Start of the SQLite thread: scheduled ``SCHED_BATCH`` where the OS has it (Linux).

    Each trip to this thread wakes it; as an ordinary thread, woken, it took the core from the event
    loop at once (the kernel preempts for a thread that slept), in the middle of whatever the loop was
    doing, on a core the two share (one per worker): at 100 streams that was about three preemptions
    of the loop per stored response, and the first events of the streams starting then waited. A batch
    thread is never preempted *for*: it runs when the loop waits, or at the next tick, with the same
    share of the core as before (no starvation; docs/performance.md, "the store's added first-event
    latency, re-measured")."""
    # Without SCHED_BATCH (not Linux) or if refused: the default policy. 0 is the calling thread.
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


class SqliteDatabase(Database):
    """A SQLite file in WAL mode, created (with its directory) on first use."""

    dialect = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        # One thread owns the connection: sqlite3 objects must not hop threads mid-transaction.
        self._thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rg-sqlite", initializer=_database_thread
        )
        self._conn: sqlite3.Connection | None = None
        self._lock = _TwoLaneLock()

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise RuntimeError("the SQLite store is not open")
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, conn)

    async def open(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)

        def connect() -> sqlite3.Connection:
            # sqlite-vec registered (once per process) before the connection opens, so it is in it
            # (store/sqlite_vec.py; when it cannot load, the vector search falls back and says why).
            sqlite_vec.load()
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
            _use_wal(conn)
            # NORMAL in WAL mode is crash-safe for the database; only the last commits can be lost on
            # power failure, never half of one.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=30000")
            return conn

        self._conn = await asyncio.get_running_loop().run_in_executor(self._thread, connect)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, conn.close)
        self._thread.shutdown(wait=True)

    @asynccontextmanager
    async def transaction(self, *, first: bool = False) -> AsyncIterator[Tx]:
        await self._lock.acquire(first)
        try:
            tx = _SqliteTx(self)
            try:
                yield tx
                await tx.commit()
            except BaseException:
                # Whatever reached the thread is undone (a trip still running there finishes first).
                await asyncio.shield(self.call(_rollback))
                raise
        finally:
            self._lock.release()


class _TwoLaneLock:
    """A FIFO lock with a second lane served first (see ``Database.transaction``'s ``first``)."""

    __slots__ = ("_first", "_held", "_rest")

    def __init__(self) -> None:
        self._held = False
        self._first: deque[asyncio.Future[None]] = deque()
        self._rest: deque[asyncio.Future[None]] = deque()

    async def acquire(self, first: bool = False) -> None:
        if not self._held and not self._first and not self._rest:
            self._held = True
            return
        lane = self._first if first else self._rest
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over just as the caller was cancelled: pass it on
            elif waiter in lane:
                lane.remove(waiter)
            raise

    def release(self) -> None:
        for lane in (self._first, self._rest):
            while lane:
                waiter = lane.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # stays held: ownership passes to that waiter
                    return
        self._held = False


# ------------------------------------------------------------------------------------------ PostgreSQL
_PLACEHOLDER = re.compile(r"\?")
_converted: dict[str, str] = {}


def _pg(sql: str) -> str:
    """``?`` placeholders as ``$1, $2…`` (our SQL never has a literal question mark)."""
    out = _converted.get(sql)
    if out is None:
        counter = iter(range(1, 10_000))
        out = _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)
        _converted[sql] = out
    return out


class _PgTx(Tx):
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def execute(self, sql: str, *args: Any) -> int:
        status: str = await self._conn.execute(_pg(sql), *args)
        tail = status.rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._conn.executemany(_pg(sql), rows)

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        records = await self._conn.fetch(_pg(sql), *args)
        return [tuple(r) for r in records]


class PostgresDatabase(Database):
    """A PostgreSQL database reached through an asyncpg pool."""

    dialect = "postgresql"
    for_update = " FOR UPDATE"

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        self._min = min_size
        self._max = max_size
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        # Imported here: a gateway on the default SQLite store does not load the driver (~3 MB).
        import asyncpg

        self._pool = await asyncpg.create_pool(self.url, min_size=self._min, max_size=self._max)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @asynccontextmanager
    async def transaction(self, *, first: bool = False) -> AsyncIterator[Tx]:
        if self._pool is None:
            raise RuntimeError("the PostgreSQL store is not open")
        async with self._pool.acquire() as conn, conn.transaction():
            yield _PgTx(conn)
