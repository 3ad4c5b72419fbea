"""The store under strain. A response larger than the store's limit: the client still gets all of it;
the store keeps what fits and says truthfully, in the Response and in a replay that ends properly, that
it was not stored in full. A database that fails mid-stream: the client's stream still ends properly,
and the stored response is completed once the database is back (never in_progress for good)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from soundness import assert_sound_stream, terminal_status

from conftest import Gateway, decode_sse, start_gateway
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.providers.scripted import ScriptedProvider

PIECES = [f"<{i:04d}>" + "x" * 994 for i in range(300)]  # 300 KB of text


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("limits")
    gateway = start_gateway(
        [
            ScriptedProvider([{"message": PIECES}], name="big"),
            ScriptedProvider([{"message": "ok"}], name="small"),
        ],
        store_url=f"sqlite:///{tmp / 'store.db'}",
        data_dir=str(tmp / "data"),
        store_max_response_bytes=64 * 1024,
    )
    yield gateway
    gateway.stop()


def stored(
    gw: Gateway, response_id: str, *, wait_for_end: float = 10
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The stored Response once it has ended (or after ``wait_for_end`` s), and its replayed events."""
    deadline = time.monotonic() + wait_for_end
    while True:
        response = httpx.get(gw.url(f"/v1/responses/{response_id}"), timeout=10).json()
        if response["status"] != "in_progress" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    replay = httpx.get(gw.url(f"/v1/responses/{response_id}?stream=true"), timeout=10)
    return response, decode_sse(replay.content)


@pytest.mark.parametrize("stream", [True, False])
def test_past_the_limit_the_client_gets_everything_and_the_store_says_so(gw: Gateway, stream: bool) -> None:
    got = httpx.post(
        gw.url("/v1/responses"), json={"model": "big", "input": "hi", "stream": stream}, timeout=30
    )
    assert got.status_code == 200
    if stream:
        events = decode_sse(got.content)
        assert_sound_stream(events)
        assert terminal_status(events) == "completed"
        client = accumulate(events).response
    else:
        client = got.json()
    assert client["status"] == "completed"
    assert client["output"][0]["content"][0]["text"] == "".join(PIECES)
    response, replay = stored(gw, client["id"])
    assert response["status"] == "failed"
    assert "not stored in full" in response["error"]["message"]
    assert_sound_stream(replay)
    assert terminal_status(replay) == "failed"
    assert sum(len(e.get("delta", "")) for e in replay) < 64 * 1024
    # The closing events the store added are stamped with the end's time like the rest.
    timed = httpx.get(gw.url(f"/v1/gateway/responses/{client['id']}/events"), timeout=10).json()["data"]
    assert [d["event"] for d in timed] == replay
    times = [d["at_ms"] for d in timed]
    assert all(isinstance(t, int) for t in times) and times == sorted(times), (
        times,
        [d["event"]["type"] for d in timed][-6:],
    )


def test_under_the_limit_nothing_changes(gw: Gateway) -> None:
    got = httpx.post(
        gw.url("/v1/responses"), json={"model": "small", "input": "hi", "stream": True}, timeout=30
    )
    events = decode_sse(got.content)
    response, replay = stored(gw, events[0]["response"]["id"])
    assert response["status"] == "completed"
    assert replay == events


class Outage:
    """Makes a store's database fail every transaction while ``down`` (a disk that filled up)."""

    def __init__(self, gw: Gateway) -> None:
        store = gw.app.store
        assert store is not None
        self.db = store.db
        self.real = self.db.transaction
        self.down = False

        def transaction(*args: object, **kwargs: object) -> object:
            if self.down:
                raise sqlite3.OperationalError("database or disk is full")
            return self.real(*args, **kwargs)

        self.db.transaction = transaction  # type: ignore[method-assign]

    def restore(self) -> None:
        self.db.transaction = self.real  # type: ignore[method-assign]


def test_a_store_that_fails_mid_stream(tmp_path: Path) -> None:
    slow = ScriptedProvider([{"message": [f"w{i} " for i in range(30)], "delay": 0.05}], name="slow")
    gw = start_gateway([slow], store_url=f"sqlite:///{tmp_path / 'store.db'}", data_dir=str(tmp_path / "d"))
    outage = Outage(gw)
    try:
        with httpx.stream(
            "POST", gw.url("/v1/responses"), json={"model": "slow", "input": "hi", "stream": True}, timeout=30
        ) as got:
            raw = b""
            for chunk in got.iter_bytes():
                raw += chunk
                if b"output_text.delta" in raw:
                    outage.down = True  # the disk fills up mid-answer
        events = decode_sse(raw)
        assert_sound_stream(events)  # the client's stream ends properly all the same
        assert terminal_status(events) == "completed"
        outage.down = False  # the disk has room again
        response_id = events[0]["response"]["id"]
        response, replay = stored(gw, response_id, wait_for_end=20)
        assert response["status"] == "completed"  # the end was written once the database was back
        assert replay == events
    finally:
        outage.restore()
        gw.stop()
