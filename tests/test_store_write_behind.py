"""A streamed stored response's row is written behind its first events (docs/store.md, "Write-behind
create"), through a real gateway on SQLite:

- a GET, an input-items list and a resume sent the moment ``response.created`` arrives find the
  response (this instance waits for the row being written), and what was stored equals what was sent;
- a create the database refuses (a trigger in the SQLite file) ends the stream already started with
  ``error`` + ``response.failed`` (``server_error``, "could not be stored"), the stream passes the
  checker, nothing half-stored is left, and other responses are unaffected;
- while another process holds the SQLite write lock for a second, a stream's first event still comes
  at once (it used to wait for the lock), and everything is stored once the lock is free.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.protocol.sse import EventStreamDecoder
from responses_gateway.providers.scripted import ScriptedProvider

JSON = dict[str, Any]
WORDS = [f"w{i} " for i in range(12)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    tmp = tmp_path_factory.mktemp("write-behind")
    db = tmp / "data" / "gateway.db"
    provider = ScriptedProvider([{"message": WORDS, "delay": 0.05}], name="m")
    gw = start_gateway([provider], store_url=f"sqlite://{db}", data_dir=str(tmp / "data"), keepalive="off")
    try:
        yield gw, db
    finally:
        gw.stop()


def _stream(gw: Gateway, text: str, on_created: Any = None) -> list[JSON]:
    body = {"model": "m", "input": text, "stream": True}
    events: list[JSON] = []
    decoder = EventStreamDecoder()
    with httpx.Client(timeout=30) as http, http.stream("POST", gw.url("/v1/responses"), json=body) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_bytes():
            for event in decoder.feed(chunk):
                events.append(event)
                if event["type"] == "response.created" and on_created is not None:
                    on_created(event["response"]["id"])
    return events + decoder.flush()


def test_reads_right_after_the_first_event_find_the_response(gateway: tuple[Gateway, Path]) -> None:
    gw, _ = gateway
    seen: dict[str, Any] = {}

    def on_created(rid: str) -> None:
        with httpx.Client(timeout=30) as http:
            seen["get"] = http.get(gw.url(f"/v1/responses/{rid}"))
            seen["items"] = http.get(gw.url(f"/v1/responses/{rid}/input_items"))
            seen["resume"] = http.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true"})

    events = _stream(gw, "hello", on_created)
    check_stream(events)
    assert events[-1]["type"] == "response.completed"
    got = seen["get"]
    assert got.status_code == 200, got.text
    assert got.json()["status"] == "in_progress"
    assert [i["content"][0]["text"] for i in seen["items"].json()["data"]] == ["hello"]
    # The resume started at once and followed the run to its end: exactly the client's stream.
    assert decode_sse(seen["resume"].content) == events
    with httpx.Client(timeout=30) as http:
        rid = events[0]["response"]["id"]
        assert http.get(gw.url(f"/v1/responses/{rid}")).json()["status"] == "completed"
        assert (
            decode_sse(http.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true"}).content) == events
        )


def test_a_create_the_database_refuses_ends_the_started_stream(gateway: tuple[Gateway, Path]) -> None:
    gw, db = gateway
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON rg_responses WHEN NEW.request LIKE '%refuse-me%'"
            " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    try:
        events = _stream(gw, "refuse-me please")
        fine = _stream(gw, "this one is fine")
    finally:
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER refuse")
    check_stream(events)
    assert events[0]["type"] == "response.created"
    error, failed = events[-2:]
    assert error["type"] == "error" and failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert "could not be stored" in failed["response"]["error"]["message"]
    assert sum(e["type"] == "response.output_text.delta" for e in events) < len(WORDS)
    rid = events[0]["response"]["id"]
    with httpx.Client(timeout=30) as http:
        assert http.get(gw.url(f"/v1/responses/{rid}")).status_code == 404
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM rg_events WHERE response_id = ?", (rid,)).fetchone() == (0,)
    check_stream(fine)
    assert fine[-1]["type"] == "response.completed"


def test_the_first_event_does_not_wait_for_a_busy_database(gateway: tuple[Gateway, Path]) -> None:
    """Another process holds the SQLite write lock for a second (as a long transaction in flight
    would): the stream still starts at once and runs live; its row and events are written once the
    lock is free, and read back whole."""
    gw, db = gateway
    hold = 1.0
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    timings: dict[str, float] = {}
    started = time.monotonic()

    def on_created(_rid: str) -> None:
        timings["created"] = time.monotonic() - started

    releaser = threading.Timer(hold, lambda: conn.execute("COMMIT"))
    releaser.start()
    try:
        events = _stream(gw, "while the database is busy", on_created)
    finally:
        releaser.join()
        conn.close()
    # Before the write-behind create the first event waited for the lock: at least `hold` seconds.
    assert timings["created"] < hold / 2, timings
    check_stream(events)
    assert events[-1]["type"] == "response.completed"
    rid = events[0]["response"]["id"]
    with httpx.Client(timeout=30) as http:
        assert http.get(gw.url(f"/v1/responses/{rid}")).json()["status"] == "completed"
        assert (
            decode_sse(http.get(gw.url(f"/v1/responses/{rid}"), params={"stream": "true"}).content) == events
        )
