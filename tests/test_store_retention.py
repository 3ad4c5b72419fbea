"""Retention (serve --store-retention): finished responses past it are deleted with their items and
events; running ones, newer ones and conversations are kept. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.response import new_response
from responses_gateway.store import PreviousResponseNotFound, ResponseNotFound
from serve_process import GATEWAY
from test_store_suite import OWNER, opened, store_url, turn, user  # noqa: F401 - store_url is a fixture

DAY = 86400.0


def test_expired_responses_go_with_their_items_and_events(store_url: str) -> None:  # noqa: F811
    async def go() -> None:
        async with opened(store_url, retention=30 * DAY) as store:
            old, _ = await turn(store, [user("old")])
            old_follow, _ = await turn(store, [user("again")], previous=old["id"])
            recent, _ = await turn(store, [user("recent")])
            # A response still running since long ago (a background job): never expired.
            running = new_response("test-model")
            builder = StreamBuilder(running)
            builder.start()
            await store.responses.create_response(
                OWNER, builder.snapshot(), request={}, input_items=[user("run")]
            )
            await store.recorder(running["id"]).add(builder.take())
            async with store.db.transaction() as tx:
                for rid in (old["id"], old_follow["id"], running["id"]):
                    await tx.execute(
                        "UPDATE rg_responses SET created_at = ? WHERE id = ?",
                        int(time.time() - 31 * DAY),
                        rid,
                    )
            assert await store.expire() == 2
            for rid in (old["id"], old_follow["id"]):
                with pytest.raises(ResponseNotFound):
                    await store.responses.get_response(OWNER, rid)
                async with store.db.transaction() as tx:
                    for table in ("rg_items", "rg_events"):
                        row = await tx.fetchone(f"SELECT COUNT(*) FROM {table} WHERE response_id = ?", rid)
                        assert row is not None and row[0] == 0, table
            with pytest.raises(PreviousResponseNotFound):
                await store.responses.resolve_input(OWNER, [user("more")], previous_response_id=old["id"])
            assert (await store.responses.get_response(OWNER, recent["id"]))["status"] == "completed"
            assert (await store.responses.get_response(OWNER, running["id"]))["status"] == "in_progress"
            assert await store.expire() == 0

    asyncio.run(go())


def test_serve_refuses_a_retention_that_is_not_positive(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(GATEWAY), "serve", "--no-local", "--data-dir", str(tmp_path), "--store-retention", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "store_retention must be positive" in done.stderr
