"""Live events of running responses, and the cancel signal, within one instance or across many.

A live log holds *every* event of a running response from sequence 0, not only those published after
someone listens: a follower reads the database up to some sequence N and then asks the live log for
everything after N, so there is no gap between the two and de-duplication is a comparison of
sequence numbers. :class:`LocalLiveLog` keeps them in memory (one instance); :class:`RedisLiveLog`
keeps them in a Redis stream per response whose entry ids are ``0-<seq+1>`` (so "after N" is a plain
XREAD from ``0-<N+1>``), shared by every instance. Cancel requests go through Redis pub/sub.
:class:`SiblingLiveLog` is the local log of one of ``serve --workers N``'s processes on one SQLite
store: followers of a sibling's response read the database (polled), cancels reach the sibling at once
over a Unix datagram socket per worker in a directory the workers share.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["RETAIN_AFTER_END", "LiveLog", "LocalLiveLog", "RedisLiveLog", "SiblingLiveLog"]

JSON = dict[str, Any]
CancelHandler = Callable[[str], None]


class LiveLog(ABC):
    """Per-response append-only event log with blocking reads, plus a cancel broadcast."""

    @abstractmethod
    async def publish(self, response_id: str, events: list[JSON]) -> None:
        """Append events (in sequence order)."""

    @abstractmethod
    async def end(self, response_id: str) -> None:
        """Mark the response finished: readers stop waiting; the log is dropped after a grace period."""

    @abstractmethod
    async def read(self, response_id: str, after: int, timeout: float) -> tuple[list[JSON], bool]:
        """Events after sequence ``after`` (waiting up to ``timeout`` for one), and whether it ended."""

    @abstractmethod
    async def broadcast_cancel(self, response_id: str) -> None:
        """Tell every instance (this one included) that ``response_id`` should stop."""

    @abstractmethod
    async def open(self, on_cancel: CancelHandler) -> None: ...

    def flushed(self) -> None:
        """Events were just written to the database: followers reading it elsewhere may look now."""
        return None

    @abstractmethod
    async def close(self) -> None: ...


class _Channel:
    __slots__ = ("changed", "ended", "events")

    def __init__(self) -> None:
        self.events: list[JSON] = []
        self.ended = False
        # Created by a reader that waits; set (and dropped) by the next publish or end.
        self.changed: asyncio.Event | None = None


# How long a finished response is remembered as finished here (its id only). Its events are dropped at
# its end: by then the database holds every event (the end is written before ``end``), so a follower
# that asks for more is told at once that the response ended and reads the rest from the database.
# Keeping the events instead (30 s, then 1 s) left every finished response's event dicts and
# snapshots for the garbage collector to traverse: at 100 streams with 1 s, ~20,000 objects, and
# gen-1 passes of 5-19 ms (docs/performance.md, "a finished response's events, dropped at its end").
RETAIN_AFTER_END = 1.0


class LocalLiveLog(LiveLog):
    """In-process live log: a list per running response and an :class:`asyncio.Event` to wake readers."""

    def __init__(self, retain_after_end: float = RETAIN_AFTER_END) -> None:
        self._channels: dict[str, _Channel] = {}
        self._retain = retain_after_end
        # Responses ended here lately: id -> when (monotonic), oldest first; pruned as responses end
        # (no timer per response). One object for the collector, whatever its size.
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._on_cancel: CancelHandler = lambda _rid: None

    async def publish(self, response_id: str, events: list[JSON]) -> None:
        self.publish_nowait(response_id, events)

    def running_here(self, response_id: str) -> bool:
        """Whether this process holds a live log for ``response_id``."""
        return response_id in self._channels

    def ended_here(self, response_id: str) -> bool:
        """Whether ``response_id`` ran here and ended within the last ``retain_after_end`` seconds."""
        at = self._ended.get(response_id)
        return at is not None and time.monotonic() - at < self._retain

    def publish_nowait(self, response_id: str, events: list[JSON]) -> None:
        """:meth:`publish` without a coroutine (the recorder's hot path)."""
        channel = self._channels.get(response_id)
        if channel is None:
            if response_id in self._ended:
                return  # nothing is published after an end (a log made now would never be dropped)
            channel = self._channels[response_id] = _Channel()
        channel.events.extend(events)
        changed = channel.changed
        if changed is not None:
            # Only a reader waits on it; without one, nothing is allocated per publish.
            changed.set()
            channel.changed = None

    async def end(self, response_id: str) -> None:
        channel = self._channels.pop(response_id, None)
        if channel is not None:
            channel.ended = True
            if channel.changed is not None:
                # A reader waiting now returns the last events from the log it holds.
                channel.changed.set()
                channel.changed = None
        # Later readers are told it ended and read the database, which holds every event by now.
        ended = self._ended
        now = time.monotonic()
        while ended and now - ended[next(iter(ended))] >= self._retain:
            ended.popitem(last=False)
        ended[response_id] = now

    async def read(self, response_id: str, after: int, timeout: float) -> tuple[list[JSON], bool]:
        channel = self._channels.get(response_id)
        if channel is None:
            if self.ended_here(response_id):
                return [], True
            # Not running here: the caller falls back to the database after this pause.
            await asyncio.sleep(min(timeout, 0.1))
            return [], False
        while True:
            events = channel.events
            # Sequence numbers are contiguous from the first event kept, so the start is computed.
            start = 0 if not events else max(0, after + 1 - int(events[0]["sequence_number"]))
            if start < len(events) or channel.ended:
                return events[start:], channel.ended
            waiter = channel.changed
            if waiter is None:
                waiter = channel.changed = asyncio.Event()
            try:
                await asyncio.wait_for(waiter.wait(), timeout)
            except TimeoutError:
                return [], False

    async def broadcast_cancel(self, response_id: str) -> None:
        self._on_cancel(response_id)

    async def open(self, on_cancel: CancelHandler) -> None:
        self._on_cancel = on_cancel

    async def close(self) -> None:
        self._channels.clear()
        self._ended.clear()


class SiblingLiveLog(LocalLiveLog):
    """:class:`LocalLiveLog` for one worker of several on one machine (``serve --workers N``).

    Each worker binds ``<directory>/<pid>.sock`` (a Unix datagram socket) and sends to every other
    socket there: a cancel (``c:<id>``), so the sibling running the response stops it at once (the
    heartbeat's ``cancel_requested`` sweep stays the fallback); and a wake-up (``f``) after each write
    of events to the database and at each response's end, so a follower of a sibling's response, which
    reads the database, looks at once instead of at its next 0.1 s poll. Events themselves are not
    sent: the database is the one copy shared between workers.
    """

    def __init__(self, directory: str | Path, retain_after_end: float = RETAIN_AFTER_END) -> None:
        super().__init__(retain_after_end)
        self.directory = Path(directory)
        self._path = self.directory / f"{os.getpid()}.sock"
        self._sock: socket.socket | None = None
        # Set (and replaced) when a sibling wrote events; followers of siblings' responses wait on it.
        self._wake: asyncio.Event | None = None

    async def open(self, on_cancel: CancelHandler) -> None:
        await super().open(on_cancel)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()  # a previous process with this pid
        sock.bind(str(self._path))
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._receive)

    def _receive(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                data = sock.recv(1024)
            except (BlockingIOError, InterruptedError):
                return
            if data.startswith(b"c:"):
                self._on_cancel(data[2:].decode(errors="replace"))
            elif data == b"f" and self._wake is not None:
                self._wake.set()
                self._wake = None

    def _send(self, message: bytes) -> None:
        sock = self._sock
        if sock is None:
            return
        for path in self.directory.glob("*.sock"):
            if path != self._path:
                # A sibling gone (its socket file not yet removed) or backed up: a cancel still
                # arrives through the heartbeat's sweep, a follower through its poll.
                with contextlib.suppress(OSError):
                    sock.sendto(message, str(path))

    async def broadcast_cancel(self, response_id: str) -> None:
        self._on_cancel(response_id)
        self._send(b"c:" + response_id.encode())

    def flushed(self) -> None:
        self._send(b"f")

    async def end(self, response_id: str) -> None:
        await super().end(response_id)
        self._send(b"f")

    async def read(self, response_id: str, after: int, timeout: float) -> tuple[list[JSON], bool]:
        if self.running_here(response_id) or self.ended_here(response_id):
            return await super().read(response_id, after, timeout)
        # A sibling's (or a finished) response: the caller reads the database after this wait.
        waiter = self._wake
        if waiter is None:
            waiter = self._wake = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.wait(), min(timeout, 0.1))
        return [], False

    async def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()
        await super().close()


class RedisLiveLog(LiveLog):
    """Live log in Redis streams (``rg:events:<id>``) with cancel over the ``rg:cancel`` channel."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "rg:",
        ttl_running: int = 24 * 3600,
        ttl_after_end: int = 300,
    ) -> None:
        self.url = url
        self._prefix = prefix
        self._ttl_running = ttl_running
        self._ttl_after_end = ttl_after_end
        self._redis: aioredis.Redis | None = None
        self._listener: asyncio.Task[None] | None = None
        self._cancel_channel = f"{prefix}cancel"

    def _key(self, response_id: str) -> str:
        return f"{self._prefix}events:{response_id}"

    @property
    def redis(self) -> aioredis.Redis:
        if self._redis is None:
            raise RuntimeError("the Redis live log is not open")
        return self._redis

    async def publish(self, response_id: str, events: list[JSON]) -> None:
        if not events:
            return
        key = self._key(response_id)
        # One round trip per batch; the expiry bounds what a crashed instance leaves behind.
        pipe = self.redis.pipeline(transaction=False)
        for event in events:
            pipe.xadd(key, {"e": orjson.dumps(event)}, id=f"0-{int(event['sequence_number']) + 1}")
        pipe.expire(key, self._ttl_running)
        await pipe.execute()

    async def end(self, response_id: str) -> None:
        key = self._key(response_id)
        pipe = self.redis.pipeline(transaction=False)
        # An automatic id is a millisecond timestamp, greater than every 0-<n> event id.
        pipe.xadd(key, {"end": b"1"}, id="*")
        pipe.expire(key, self._ttl_after_end)
        await pipe.execute()

    async def read(self, response_id: str, after: int, timeout: float) -> tuple[list[JSON], bool]:
        reply: Any = await self.redis.xread(
            {self._key(response_id): f"0-{after + 1}"}, block=max(1, int(timeout * 1000)), count=1000
        )
        events: list[JSON] = []
        ended = False
        for _key, entries in reply or ():
            for _entry_id, fields in entries:
                if b"end" in fields:
                    ended = True
                else:
                    events.append(orjson.loads(fields[b"e"]))
        return events, ended

    async def broadcast_cancel(self, response_id: str) -> None:
        await self.redis.publish(self._cancel_channel, response_id)

    async def open(self, on_cancel: CancelHandler) -> None:
        # Imported here: without Redis the client (and the cryptography and OpenTelemetry modules it
        # loads, ~14 MB per process) stays out of the gateway.
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(self.url)
        await self._redis.ping()
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self._cancel_channel)

        async def listen() -> None:
            try:
                async for message in pubsub.listen():
                    data = message.get("data")
                    if isinstance(data, bytes):
                        on_cancel(data.decode())
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]

        self._listener = asyncio.create_task(listen(), name="rg-redis-cancel-listener")

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
