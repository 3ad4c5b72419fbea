"""A misbehaving upstream, for every HTTP back end: whatever it does, the client gets a sound stream and
the store agrees with it.

Each case streams through a real gateway with a SQLite store and asserts one terminal event, contiguous
sequence numbers and the checker's verdict (soundness.py), then that ``GET /v1/responses/{id}`` reads
back the status the stream ended with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from gateways import stored, upstream  # noqa: F401 - fixtures, see pyproject
from soundness import assert_sound_stream, terminal_status
from wire import BACKENDS, answer, error_body, provider

from conftest import Gateway, decode_sse
from responses_gateway.providers.base import Provider
from upstream_mock import UpstreamMock, error_reply, stream_reply

JSON = dict[str, Any]
PIECES = ["Héllo ", "wörld — ", "✓ 日本語 ", "🙂 done."]
TEXT = "".join(PIECES)


def request(gw: Gateway) -> JSON:
    return {"model": gw.registry.names()[0], "input": "hi", "stream": True}


def run(gw: Gateway, *, may_fail_before_start: bool = False) -> tuple[list[JSON], float]:
    """One streamed request: its events (asserted sound, and agreeing with the store) and duration.

    With ``may_fail_before_start``, an upstream failure before anything was streamed may also be a
    plain HTTP error in OpenAI's shape (then no events are returned).
    """
    started = time.monotonic()
    with httpx.Client(timeout=30) as client:
        raw = client.post(gw.url("/v1/responses"), json=request(gw))
        elapsed = time.monotonic() - started
        if may_fail_before_start and raw.status_code != 200:
            assert raw.status_code >= 500 and raw.json()["error"]["message"], raw.text
            return [], elapsed
        assert raw.status_code == 200, raw.text
        events = [e for e in decode_sse(raw.content) if e.get("type") != "keepalive"]
        assert_sound_stream(events)
        stored = client.get(gw.url(f"/v1/responses/{events[0]['response']['id']}"))
    assert stored.status_code == 200, stored.text
    assert stored.json()["status"] == terminal_status(events)
    return events, elapsed


def output_text(events: list[JSON]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


@pytest.mark.parametrize("name", BACKENDS)
def test_complete_answer_on_a_connection_left_open(
    name: str, upstream: UpstreamMock, stored: Callable[[Provider], Gateway]
) -> None:
    """The answer's own end ([DONE], message_stop, finishReason, response.completed) ends the
    Response at once; the upstream keeping its socket open must not turn it into a failure."""
    body = answer(name, PIECES)
    upstream.reset([stream_reply(body, stall_after=len(body))])
    events, elapsed = run(stored(provider(name, upstream.url, read_timeout=3)))
    assert terminal_status(events) == "completed", events[-1]
    assert output_text(events) == TEXT
    assert elapsed < 2.5, f"the Response waited {elapsed:.1f} s for the upstream to close"


@pytest.mark.parametrize("name", BACKENDS)
def test_utf8_split_across_every_read(
    name: str, upstream: UpstreamMock, stored: Callable[[Provider], Gateway]
) -> None:
    upstream.reset([stream_reply(answer(name, PIECES), split=True, max_piece=1, delay=0)])
    events, _ = run(stored(provider(name, upstream.url)))
    assert terminal_status(events) == "completed"
    assert output_text(events) == TEXT


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("cut", [0.3, 0.7])
def test_connection_dropped_mid_stream(
    name: str, cut: float, upstream: UpstreamMock, stored: Callable[[Provider], Gateway]
) -> None:
    body = answer(name, PIECES)
    upstream.reset([stream_reply(body[: int(len(body) * cut)])])
    events, _ = run(stored(provider(name, upstream.url)), may_fail_before_start=cut < 0.5)
    assert not events or terminal_status(events) == "failed"


@pytest.mark.parametrize("name", BACKENDS)
def test_stall_fails_on_the_idle_timeout(
    name: str, upstream: UpstreamMock, stored: Callable[[Provider], Gateway]
) -> None:
    body = answer(name, PIECES)
    upstream.reset([stream_reply(body, stall_after=len(body) // 2)])
    events, elapsed = run(stored(provider(name, upstream.url, read_timeout=0.5)), may_fail_before_start=True)
    assert not events or terminal_status(events) == "failed"
    assert elapsed < 5


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff\xfe garbage \x81\n\n",
        b"data: {not json\n\ndata: [1, 2\n\n",
        b"<html>502 Bad Gateway</html>",
    ],
    ids=["binary", "broken-json", "html"],
)
def test_garbage_body(
    name: str, garbage: bytes, upstream: UpstreamMock, stored: Callable[[Provider], Gateway]
) -> None:
    upstream.reset([stream_reply(garbage)])
    events, _ = run(stored(provider(name, upstream.url)), may_fail_before_start=True)
    assert not events or terminal_status(events) == "failed"


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("status", [429, 500, 503])
def test_http_error_before_the_first_byte(
    name: str, status: int, upstream: UpstreamMock, stored: Callable[[Provider], Gateway]
) -> None:
    upstream.reset([error_reply(status, error_body(name, "upstream trouble"), headers={"retry-after": "1"})])
    gw = stored(provider(name, upstream.url))
    with httpx.Client(timeout=30) as client:
        raw = client.post(gw.url("/v1/responses"), json=request(gw))
    if status == 429:
        assert raw.status_code == 429, raw.text
        assert raw.headers["retry-after"] == "1"
    else:
        assert raw.status_code >= 500, raw.text
    assert raw.headers["content-type"].startswith("application/json")
    assert set(raw.json()["error"]) >= {"message", "type", "code", "param"}
