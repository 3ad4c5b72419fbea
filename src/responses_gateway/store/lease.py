"""The instance lease: which gateway process runs which response, and recovery when one dies.

Running responses belong to an *instance* (one gateway process) that heartbeats in ``rg_instances``.
An instance whose heartbeat is older than the lease, or whose process is gone from this host, is dead:
its running responses are failed by whoever notices first (start-up, then every heartbeat), with the
events it had written kept, what they left open closed (store/recovery.py) and a ``response.failed``
appended so followers see an end. The heartbeat also picks up cancel requests for the responses this
instance runs, so a cancel reaches it from any instance without Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable

import orjson

from .db import Database
from .live import LiveLog
from .recovery import close_open_items
from .responses import write_final
from .rows import JSON, RUNNING, dumps

__all__ = ["Lease"]

_CRASH_MESSAGE = "The gateway instance running this response stopped before it finished."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (dead, not yet reaped: a ``serve --workers`` worker whose parent was killed waits for
    # init to reap it) answers signal 0 but runs nothing.
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()  # noqa: SIM115
    except OSError:
        return True  # no /proc (not Linux): signal 0 is all there is
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


class Lease:
    """This instance's row in ``rg_instances``, its heartbeat, and the recovery of dead instances' work.

    ``on_cancel(response_id)`` is called for each cancel request the heartbeat finds for a response
    this instance runs.
    """

    def __init__(
        self,
        db: Database,
        live: LiveLog,
        *,
        instance_id: str,
        lease_seconds: float,
        on_cancel: Callable[[str], None],
    ) -> None:
        self.db = db
        self.live = live
        self.instance_id = instance_id
        self.lease_seconds = lease_seconds
        self.on_cancel = on_cancel
        self.host = socket.gethostname()
        self._heartbeat: asyncio.Task[None] | None = None

    async def register(self) -> None:
        """Write this instance's row (its lease starts now)."""
        now = time.time()
        async with self.db.transaction() as tx:
            await tx.execute(
                "INSERT INTO rg_instances (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)",
                self.instance_id,
                self.host,
                os.getpid(),
                now,
                now,
            )

    def start_heartbeat(self, after_beat: Callable[[], Awaitable[None]]) -> None:
        """Heartbeat every ``lease_seconds / 3``, then run ``after_beat`` (the store's housekeeping)."""
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(after_beat), name="rg-store-heartbeat")

    async def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None

    async def release(self) -> None:
        """Expire the lease (rather than deleting the row): the next sweep fails what this instance ran."""
        async with self.db.transaction() as tx:
            await tx.execute("UPDATE rg_instances SET heartbeat_at = 0 WHERE id = ?", self.instance_id)

    async def _heartbeat_loop(self, after_beat: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.heartbeat()
                await after_beat()
            except Exception:  # a database hiccup must not end the loop; the next beat retries
                continue

    async def heartbeat(self) -> None:
        """Renew this instance's lease, pick up cancel requests, fail dead instances' responses."""
        async with self.db.transaction() as tx:
            await tx.execute(
                "UPDATE rg_instances SET heartbeat_at = ? WHERE id = ?", time.time(), self.instance_id
            )
            # Without Redis this is how a cancel made on another instance reaches this one.
            rows = await tx.fetch(
                "SELECT id FROM rg_responses WHERE instance_id = ? AND cancel_requested = 1"
                " AND status IN ('queued', 'in_progress')",
                self.instance_id,
            )
        for (response_id,) in rows:
            self.on_cancel(response_id)
        await self.recover()

    async def recover(self) -> list[str]:
        """Fail responses left running by dead instances; the ids failed."""
        now = time.time()
        async with self.db.transaction() as tx:
            instances = await tx.fetch("SELECT id, host, pid, heartbeat_at FROM rg_instances")
            alive = {
                iid
                for iid, host, pid, beat in instances
                if iid == self.instance_id
                or (beat >= now - self.lease_seconds and (host != self.host or _pid_alive(int(pid))))
            }
            dead = {iid for iid, *_ in instances} - alive
            orphans = [
                rid
                for rid, iid in await tx.fetch(
                    "SELECT id, instance_id FROM rg_responses WHERE status IN ('queued', 'in_progress')"
                )
                if iid not in alive
            ]
        failed = [rid for rid in orphans if await self._fail_orphan(rid, alive)]
        if dead:
            async with self.db.transaction() as tx:
                for iid in dead:
                    still = await tx.fetchone(
                        "SELECT 1 FROM rg_responses WHERE instance_id = ?"
                        " AND status IN ('queued', 'in_progress')",
                        iid,
                    )
                    if still is None:
                        await tx.execute("DELETE FROM rg_instances WHERE id = ?", iid)
        return failed

    async def _fail_orphan(self, response_id: str, alive: set[str]) -> bool:
        async with self.db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT status, instance_id, response FROM rg_responses WHERE id = ?" + self.db.for_update,
                response_id,
            )
            if row is None or row[0] not in RUNNING or row[1] in alive:
                return False
            response: JSON = orjson.loads(row[2])
            rows = await tx.fetch(
                "SELECT seq, event FROM rg_events WHERE response_id = ? ORDER BY seq", response_id
            )
            stored = [orjson.loads(text) for _seq, text in rows]
            last = int(rows[-1][0]) if rows else -1
            # What the crash left open is closed (incomplete) first, as a live failure would do.
            closing, output = close_open_items(stored, last + 1)
            response.update(
                status="failed",
                error={"code": "server_error", "message": _CRASH_MESSAGE},
                output=output,
            )
            last += len(closing)
            tail = [
                *closing,
                {
                    "type": "error",
                    "sequence_number": last + 1,
                    "code": "server_error",
                    "message": _CRASH_MESSAGE,
                    "param": None,
                    "error": {
                        "type": "server_error",
                        "code": "server_error",
                        "message": _CRASH_MESSAGE,
                        "param": None,
                    },
                },
                {"type": "response.failed", "sequence_number": last + 2, "response": response},
            ]
            await tx.executemany(
                "INSERT INTO rg_events (response_id, seq, event) VALUES (?, ?, ?)",
                [(response_id, e["sequence_number"], dumps(e)) for e in tail],
            )
            await write_final(self.db, tx, response_id, response)
        await self.live.publish(response_id, tail)
        await self.live.end(response_id)
        return True
