"""Stored responses across real gateway processes: a SIGKILL mid-stream, and two instances sharing a store.

Each gateway here is ``responses-gateway serve`` in its own process (``--no-local --script``, a slow
scripted model), talked to over HTTP:

- SIGKILL while a stored response streams, then a restart on the same store (SQLite and PostgreSQL):
  the response reads back ``failed``, never ``in_progress``; its stored events are exactly what the
  client was sent, up to the crash, and pass the stream checker as a prefix.
- Two instances A and B on one PostgreSQL and one Redis: a background response started on A is
  resumed on B with ``starting_after``; the joined stream passes the checker with no gap and no
  duplicate, and equals what A itself streamed. A cancel sent to B stops the response running on A.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import check_stream
from responses_gateway.protocol.checker import StreamChecker
from responses_gateway.protocol.sse import EventStreamDecoder
from test_store_services import fresh_pg_database, require

JSON = dict[str, Any]
GATEWAY = Path(sys.executable).parent / "responses-gateway"
PG_DB = "rg_processes_test"
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")
DELTA = "response.output_text.delta"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pg_url() -> str:
    """A database of this module's own on the test server, fresh for each test."""
    return fresh_pg_database(PG_DB)


def _slow_script(path: Path, deltas: int, delay: float) -> Path:
    """Model ``slow``: ``deltas`` words ``delay`` s apart; an input containing "quick" gets "ok" at once."""
    words = ", ".join(f'"w{i} "' for i in range(deltas))
    path.write_text(
        "model: slow\nturns:\n"
        "  - when: {text_contains: quick}\n    steps: [{message: [ok]}]\n"
        f"  - steps:\n      - message: [{words}]\n        delay: {delay}\n"
    )
    return path


class GatewayProcess:
    """``responses-gateway serve`` in a child process, on a free port, logging to a file."""

    def __init__(self, tmp: Path, name: str, *args: str) -> None:
        self.port = _free_port()
        self.log = tmp / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RG_")}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(GATEWAY),
                    "serve",
                    "--no-local",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{name} exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url("/health"), timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def processes() -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for gw in started:
        gw.stop()


class EventReader:
    """Reads an SSE response event by event."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.chunks = response.iter_bytes()
        self.decoder = EventStreamDecoder()
        self.buffer: list[JSON] = []
        self.ended = False

    def next(self) -> JSON | None:
        while not self.buffer:
            try:
                chunk = next(self.chunks)
            except StopIteration:
                self.buffer += self.decoder.flush()
                self.ended = True
                break
            self.buffer += self.decoder.feed(chunk)
        return self.buffer.pop(0) if self.buffer else None

    def until(self, done: Any) -> list[JSON]:
        """Events up to and including the first for which ``done(event, events_so_far)`` holds."""
        events: list[JSON] = []
        while (event := self.next()) is not None:
            events.append(event)
            if done(event, events):
                break
        return events

    def rest(self) -> list[JSON]:
        return self.until(lambda e, _: False)


def _prefix_violations(events: list[JSON]) -> list[str]:
    checker = StreamChecker("openai")
    return [str(v) for e in events for v in checker.feed(e)]


# ------------------------------------------------------------------------------------ SIGKILL
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sigkill_mid_stream_then_restart(
    backend: str, tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    store = f"sqlite://{tmp_path}/data/gateway.db" if backend == "sqlite" else _pg_url()
    script = _slow_script(tmp_path / "slow.yaml", deltas=400, delay=0.03)
    args = ("--script", str(script), "--store", store, "--data-dir", str(tmp_path / "data"))
    first = GatewayProcess(tmp_path, "first", *args)
    processes.append(first)

    body = {"model": "slow", "input": "tell me", "stream": True, "store": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", first.url("/v1/responses"), json=body) as resp:
        assert resp.status_code == 200
        reader = EventReader(resp)
        seen = reader.until(lambda e, events: sum(x["type"] == DELTA for x in events) >= 15)
        # Let a few flush intervals pass so the database holds more than the opening events.
        time.sleep(0.4)
        seen += [e for e in reader.buffer]
        response_id = seen[0]["response"]["id"]
        first.kill()
    assert all(e["type"] not in TERMINAL for e in seen)

    second = GatewayProcess(tmp_path, "second", *args)
    processes.append(second)
    stored = httpx.get(second.url(f"/v1/responses/{response_id}"), timeout=10)
    assert stored.status_code == 200, stored.text
    snapshot = stored.json()
    assert snapshot["status"] == "failed"
    assert snapshot["error"]["code"] == "server_error"
    inputs = httpx.get(second.url(f"/v1/responses/{response_id}/input_items"), timeout=10).json()
    assert [i["content"][0]["text"] for i in inputs["data"]] == ["tell me"]

    with httpx.Client(timeout=30) as http:
        replay_resp = http.get(second.url(f"/v1/responses/{response_id}"), params={"stream": "true"})
    assert replay_resp.status_code == 200, replay_resp.text
    decoder = EventStreamDecoder()
    replay = decoder.feed(replay_resp.content) + decoder.flush()
    *body, error, failed = replay
    # Recovery closes what the crash left open (incomplete), as a live failure does: the whole replay
    # is a valid stream.
    check_stream(replay, strict=False)
    closing = 0
    while body[-1 - closing]["type"].endswith(".done"):
        closing += 1
    prefix = body[: len(body) - closing]
    assert closing >= 1 and body[-1]["type"] == "response.output_item.done"
    assert body[-1]["item"]["status"] == "incomplete"
    # The events written before the crash: a contiguous prefix, identical to what the client was sent
    # where the two overlap, and a valid start of a stream.
    assert [e["sequence_number"] for e in body] == list(range(len(body)))
    overlap = min(len(prefix), len(seen))
    assert prefix[:overlap] == seen[:overlap]
    assert sum(e["type"] == DELTA for e in prefix) >= 10, [e["type"] for e in prefix]
    assert _prefix_violations(prefix) == []
    # Then the end recovery wrote for it.
    assert error["type"] == "error" and error["sequence_number"] == len(body)
    assert error["code"] == "server_error"
    assert failed["type"] == "response.failed" and failed["sequence_number"] == len(body) + 1
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["id"] == response_id

    # The restarted gateway serves new stored responses on the same store.
    quick = {"model": "slow", "input": "quick one", "store": True, "stream": False}
    script_done = httpx.post(second.url("/v1/responses"), json=quick, timeout=60)
    assert script_done.status_code == 200, script_done.text
    assert script_done.json()["status"] == "completed"
    assert script_done.json()["output"][0]["content"][0]["text"] == "ok"


# ------------------------------------------------------------------------------------ two instances
def _two_instances(
    tmp_path: Path, processes: list[GatewayProcess], deltas: int, delay: float
) -> tuple[GatewayProcess, GatewayProcess]:
    store, redis = _pg_url(), require("redis")
    script = _slow_script(tmp_path / "slow.yaml", deltas=deltas, delay=delay)
    gateways = []
    for name in ("A", "B"):
        gw = GatewayProcess(
            tmp_path,
            name,
            "--script",
            str(script),
            "--store",
            store,
            "--redis",
            redis,
            "--data-dir",
            str(tmp_path / f"data-{name}"),
        )
        processes.append(gw)
        gateways.append(gw)
    return gateways[0], gateways[1]


def test_background_stream_started_on_a_resumes_on_b(tmp_path: Path, processes: list[GatewayProcess]) -> None:
    a, b = _two_instances(tmp_path, processes, deltas=60, delay=0.03)
    body = {"model": "slow", "input": "tell me", "stream": True, "store": True, "background": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", a.url("/v1/responses"), json=body) as on_a:
        assert on_a.status_code == 200
        reader_a = EventReader(on_a)
        head = reader_a.until(lambda e, events: sum(x["type"] == DELTA for x in events) >= 10)
        response_id = head[0]["response"]["id"]
        n = head[-1]["sequence_number"]
        assert n == len(head) - 1
        # Resume on B, mid-stream, after the last event A has delivered so far.
        with http.stream(
            "GET",
            b.url(f"/v1/responses/{response_id}"),
            params={"stream": "true", "starting_after": str(n)},
        ) as on_b:
            assert on_b.status_code == 200, on_b.read()
            tail = EventReader(on_b).rest()
        rest_a = reader_a.rest()
    joined = head + tail
    assert [e["sequence_number"] for e in joined] == list(range(len(joined)))
    assert joined[-1]["type"] == "response.completed"
    assert sum(e["type"] == DELTA for e in joined) == 60
    check_stream(joined)
    # B relayed exactly the events A streamed itself.
    assert tail == rest_a
    final = httpx.get(b.url(f"/v1/responses/{response_id}"), timeout=10).json()
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "".join(f"w{i} " for i in range(60))


def test_cancel_on_b_stops_the_response_running_on_a(tmp_path: Path, processes: list[GatewayProcess]) -> None:
    a, b = _two_instances(tmp_path, processes, deltas=400, delay=0.03)  # 12 s if nothing stops it
    body = {"model": "slow", "input": "tell me", "stream": True, "store": True, "background": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", a.url("/v1/responses"), json=body) as on_a:
        reader = EventReader(on_a)
        head = reader.until(lambda e, events: sum(x["type"] == DELTA for x in events) >= 5)
        response_id = head[0]["response"]["id"]
        t0 = time.monotonic()
        cancelled = http.post(b.url(f"/v1/responses/{response_id}/cancel"))
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        rest = reader.rest()
        stopped_after = time.monotonic() - t0
    assert stopped_after < 6, stopped_after
    events = head + rest
    # A's stream still ends properly: a terminal event, and a valid stream throughout.
    assert events[-1]["type"] in TERMINAL
    check_stream(events)
    assert sum(e["type"] == DELTA for e in events) < 400
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for gw in (a, b):
        assert httpx.get(gw.url(f"/v1/responses/{response_id}"), timeout=10).json()["status"] == "cancelled"
    # The work on A really stopped: no more events are recorded after the cancel.
    time.sleep(0.5)
    with httpx.Client(timeout=30) as http:
        replay = http.get(a.url(f"/v1/responses/{response_id}"), params={"stream": "true"})
    decoder = EventStreamDecoder()
    stored = decoder.feed(replay.content) + decoder.flush()
    assert len(stored) <= len(events) + 2


# ------------------------------------------------------------------------------------ SIGTERM
def test_sigterm_with_an_open_stream_ends_it_and_exits(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    """A graceful stop does not wait forever for a long stream: after --shutdown-timeout the stream is
    ended, the process exits, and the response is stored as failed (never left in_progress)."""
    store = f"sqlite://{tmp_path}/data/gateway.db"
    script = _slow_script(tmp_path / "slow.yaml", deltas=2000, delay=0.05)
    args = ("--script", str(script), "--store", store, "--data-dir", str(tmp_path / "data"))
    gw = GatewayProcess(tmp_path, "term", *args, "--shutdown-timeout", "1")
    processes.append(gw)
    body = {"model": "slow", "input": "tell me", "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", gw.url("/v1/responses"), json=body) as resp:
        reader = EventReader(resp)
        seen = reader.until(lambda e, events: sum(x["type"] == DELTA for x in events) >= 3)
        response_id = seen[0]["response"]["id"]
        stopped_at = time.monotonic()
        gw.proc.terminate()
        seen += reader.rest()
    gw.proc.wait(timeout=20)
    assert time.monotonic() - stopped_at < 10, "the gateway waited for the stream instead of ending it"
    # The client was told, in the stream itself, and the stream is well formed up to its end.
    check_stream(seen, strict=False)
    assert seen[-1]["type"] == "response.failed"
    assert seen[-1]["response"]["error"]["code"] == "server_error"

    again = GatewayProcess(tmp_path, "again", *args)
    processes.append(again)
    snapshot = httpx.get(again.url(f"/v1/responses/{response_id}"), timeout=10).json()
    assert snapshot["status"] in ("failed", "cancelled"), snapshot["status"]
    replay = httpx.get(again.url(f"/v1/responses/{response_id}"), params={"stream": "true"}, timeout=30)
    decoder = EventStreamDecoder()
    events = decoder.feed(replay.content) + decoder.flush()
    check_stream(events, strict=False)
    assert events[-1]["type"] == "response.failed"


def _open_and_close(path: str, barrier: Any) -> None:
    import asyncio

    from responses_gateway.store import open_store

    async def main() -> None:
        barrier.wait()
        store = await open_store(f"sqlite:///{path}")
        await store.close()

    asyncio.run(main())


def test_workers_opening_a_new_sqlite_file_together_all_start(tmp_path: Path) -> None:
    """The workers of ``serve --workers N`` open the store at the same moment. On a new file, turning
    WAL on needs an exclusive lock SQLite does not wait for while another connection reads: one
    worker's start-up failed with "database is locked" (3 in 30 such pairs before the fix)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    failed = 0
    for round_ in range(20):
        path = str(tmp_path / f"gateway-{round_}.db")
        barrier = context.Barrier(2)
        procs = [context.Process(target=_open_and_close, args=(path, barrier)) for _ in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(60)
        failed += sum(proc.exitcode != 0 for proc in procs)
    assert failed == 0
