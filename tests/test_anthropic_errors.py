"""Anthropic failures: HTTP errors before the stream, error events inside it, broken connections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.request import parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.fallback import FallbackProvider
from responses_gateway.providers.transport import Timeouts
from upstream_mock import UpstreamMock, drive, encode_chunks, error_reply, fixture_reply, stream_reply

SECRET = "sk-ant-api03-verysecretvalue-1234567890"


def start(input_tokens: int = 10) -> dict[str, Any]:
    usage = {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
             "output_tokens": 1}  # fmt: skip
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [],
               "usage": usage}  # fmt: skip
    return {"type": "message_start", "message": message}


def text_block(index: int, *chunks: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
    ]
    out += [{"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": c}}
            for c in chunks]  # fmt: skip
    out.append({"type": "content_block_stop", "index": index})
    return out


OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def provider(upstream: UpstreamMock, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider(base_url=upstream.url, api_key=SECRET, **kw)


def run_raw(upstream: UpstreamMock, **kw: Any) -> tuple[list[dict[str, Any]], ProviderError | None]:
    """Events the builder got, and the ProviderError raised before the first yield (if any)."""
    req = parse_request({"model": "claude", "input": "hi"})
    builder = StreamBuilder(new_response(req.model, **req.echo()))
    builder.start()
    events = builder.take()
    prov = provider(upstream, **kw)

    async def go() -> ProviderError | None:
        try:
            async for _ in prov.stream(req, builder):
                events.extend(builder.take())
        except ProviderError as exc:
            return exc
        finally:
            await prov.aclose()
        return None

    err = asyncio.run(go())
    events.extend(builder.take())
    return events, err


@pytest.mark.parametrize(
    ("name", "status", "code", "param"),
    [
        ("anthropic-messages__http-401-authentication-error-body__mirascope-mirascope.json", 502,
         "upstream_authentication_error", None),
        ("anthropic-messages__http-404-not-found-error-body__mirascope-mirascope.json", 404,
         "model_not_found", "model"),
    ],
)  # fmt: skip
def test_http_error_raises_before_any_event(
    upstream: UpstreamMock, name: str, status: int, code: str, param: str | None
) -> None:
    upstream.reset([fixture_reply(name)])
    events, err = run_raw(upstream)
    assert err is not None
    assert (err.status, err.code, err.param) == (status, code, param)
    assert SECRET not in err.message
    # Nothing but the server's own opening events: a failed attempt leaves the builder untouched.
    assert [e["type"] for e in events] == ["response.created", "response.in_progress"]


def test_overloaded_529_with_retry_after(upstream: UpstreamMock) -> None:
    upstream.reset([error_reply(529, OVERLOADED, headers={"retry-after": "7"})])
    _, err = run_raw(upstream)
    assert err is not None
    assert (err.status, err.code, err.retry_after) == (503, "server_is_overloaded", 7.0)


def test_fallback_retries_a_429_then_streams(upstream: UpstreamMock) -> None:
    rate = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    upstream.reset(
        [
            error_reply(429, rate, headers={"retry-after-ms": "10"}),
            fixture_reply("anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"),
        ]
    )
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    chain = FallbackProvider([("claude", provider(upstream))], retries=2, sleep=sleep)
    events = asyncio.run(drive(chain, {"model": "claude", "input": "hi"}))
    assert events[-1]["type"] == "response.completed"
    assert check(events) == []
    assert len(upstream.requests) == 2
    assert waits and waits[0] == pytest.approx(0.01)


def test_error_event_before_content_raises_for_retry(upstream: UpstreamMock) -> None:
    upstream.reset([stream_reply(encode_chunks([start(), {"type": "ping"}, OVERLOADED], "anthropic"))])
    events, err = run_raw(upstream)
    assert err is not None and (err.status, err.code) == (503, "server_is_overloaded")
    assert len(events) == 2


def test_error_event_mid_stream_fails_the_response(upstream: UpstreamMock) -> None:
    body = encode_chunks([start(), *text_block(0, "Hello", " wor"), OVERLOADED], "anthropic")
    upstream.reset([stream_reply(body, split=True, max_piece=9)])
    events, err = run_raw(upstream)
    assert err is None
    assert check(events) == []
    types = [e["type"] for e in events]
    assert types[-2:] == ["error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["error"] == {"code": "server_is_overloaded", "message": "Overloaded"}
    assert failed["output"][0]["status"] == "incomplete"
    assert failed["output"][0]["content"][0]["text"] == "Hello wor"
    assert failed["usage"]["input_tokens"] == 10


def test_stream_cut_before_message_stop_fails(upstream: UpstreamMock) -> None:
    body = encode_chunks([start(), *text_block(0, "partial")], "anthropic")
    upstream.reset([stream_reply(body)])
    events, err = run_raw(upstream)
    assert err is None
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert "message_stop" in events[-1]["response"]["error"]["message"]


def test_empty_200_stream_raises(upstream: UpstreamMock) -> None:
    upstream.reset([stream_reply(b"")])
    _, err = run_raw(upstream)
    assert err is not None and err.status == 502


def test_idle_upstream_mid_stream_fails_with_timeout(upstream: UpstreamMock) -> None:
    body = encode_chunks([start(), *text_block(0, "slow")], "anthropic")
    upstream.reset([stream_reply(body, stall_after=len(body))])
    events, err = run_raw(upstream, timeouts=Timeouts(read=0.3))
    assert err is None
    assert events[-1]["type"] == "response.failed"
    assert "timeout" in events[-1]["response"]["error"]["message"]
    assert upstream.wait_disconnect()


def test_connection_refused_is_502() -> None:
    prov = AnthropicProvider(base_url="http://127.0.0.1:9", api_key=SECRET, timeouts=Timeouts(connect=2))

    async def go() -> None:
        await drive(prov, {"model": "claude", "input": "hi"})

    with pytest.raises(ProviderError) as info:
        asyncio.run(go())
    assert info.value.status == 502 and SECRET not in info.value.message


def test_client_going_away_closes_the_upstream_connection(upstream: UpstreamMock) -> None:
    body = encode_chunks([start(), *text_block(0, "a", "b", "c")], "anthropic")
    upstream.reset([stream_reply(body, stall_after=len(body) - 30)])
    req = parse_request({"model": "claude", "input": "hi"})
    builder = StreamBuilder(new_response(req.model, **req.echo()))
    builder.start()
    prov = provider(upstream)

    async def go() -> bool:
        gen = prov.stream(req, builder)
        assert isinstance(gen, AsyncGenerator)
        await gen.__anext__()
        await gen.aclose()  # what the server does when its client disconnects
        disconnected = await asyncio.to_thread(upstream.wait_disconnect, 5.0)
        await prov.aclose()
        return disconnected

    assert asyncio.run(go())
