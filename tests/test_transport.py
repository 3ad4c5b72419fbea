"""The upstream transport, error mapping and the mock upstream, against a real local HTTP server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from fixtures_loader import load_json
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.transport import StopPumping, Timeouts, Transport, UpstreamResponse
from responses_gateway.providers.upstream_errors import (
    from_error_payload,
    from_http,
    parse_retry_after,
    redact_url,
    scrub,
)
from upstream_mock import (
    UpstreamMock,
    encode_chunks,
    error_reply,
    fixture_reply,
    json_reply,
    stream_reply,
)

SECRET = "sk-ant-api03-SECRETSECRETSECRET-0123456789"


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(autouse=True)
def _fresh(upstream: UpstreamMock) -> None:
    upstream.reset()


async def _post(transport: Transport, url: str, body: Any, **kw: Any) -> UpstreamResponse:
    return await transport.post(url, {"x-api-key": SECRET}, body, **kw)


def test_post_streams_chunks_and_records_request(upstream: UpstreamMock) -> None:
    payload = b"".join(b'event: e\ndata: {"i": %d}\n\n' % i for i in range(200))
    upstream.enqueue(stream_reply(payload, split=True, seed=3, max_piece=17))

    async def go() -> tuple[bytes, int]:
        transport = Transport()
        try:
            resp = await _post(transport, upstream.url + "/v1/messages", {"a": [1, "é"], "b": None})
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            pieces = [c async for c in resp.iter_chunks()]
            return b"".join(pieces), len(pieces)
        finally:
            await transport.aclose()

    body, count = asyncio.run(go())
    assert body == payload
    assert count >= 1
    (req,) = upstream.requests
    assert (req.method, req.path) == ("POST", "/v1/messages")
    assert req.headers["x-api-key"] == SECRET
    assert req.headers["content-type"] == "application/json"
    assert req.body == orjson.dumps({"a": [1, "é"], "b": None})


def test_read_returns_error_body_and_pool_is_reused(upstream: UpstreamMock) -> None:
    upstream.enqueue(json_reply({"error": {"message": "nope"}}, status=400))

    async def go() -> list[Any]:
        transport = Transport()
        try:
            out = []
            for _ in range(3):
                resp = await _post(transport, upstream.url + "/x", {})
                out.append((resp.status, await resp.json()))
            assert transport.idle_connections() == 1  # the three requests shared one connection
            return out
        finally:
            await transport.aclose()

    assert asyncio.run(go()) == [(400, {"error": {"message": "nope"}})] * 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_proxy_aware_client_streams_the_same(upstream: UpstreamMock) -> None:
    """``trust_env=True`` (HTTP(S)_PROXY honoured) takes aiohttp, which speaks to proxies: same results."""
    payload = b"".join(b'event: e\ndata: {"i": %d}\n\n' % i for i in range(50))
    upstream.enqueue(
        stream_reply(payload, split=True, seed=5, max_piece=13), json_reply({"ok": 1}, status=429)
    )

    async def go() -> tuple[bytes, int, Any, str]:
        transport = Transport(trust_env=True)
        try:
            resp = await _post(transport, upstream.url + "/v1/messages", {})
            body = b"".join([c async for c in resp.iter_chunks()])
            err = await _post(transport, upstream.url + "/v1/messages", {})
            return body, err.status, await err.json(), repr(transport)
        finally:
            await transport.aclose()

    body, status, err, shown = asyncio.run(go())
    assert body == payload
    assert (status, err) == (429, {"ok": 1})
    assert shown == "<Transport open>"


@pytest.mark.parametrize("trust_env", [False, True], ids=["http1", "aiohttp"])
def test_pump_delivers_the_body_and_stops_when_asked(upstream: UpstreamMock, trust_env: bool) -> None:
    """``pump`` (the push relay's read) gives the same bytes as iter_chunks on both clients; a
    callback's awaitable is waited for; StopPumping ends it early (the stalled body is then dropped)."""
    payload = b"".join(b'data: {"i": %d}\n\n' % i for i in range(300))
    upstream.enqueue(
        stream_reply(payload, split=True, seed=9, max_piece=40, delay=0),
        stream_reply(payload, stall_after=len(payload) // 2),
    )

    async def go() -> tuple[bytes, int, int]:
        transport = Transport(trust_env=trust_env)
        got: list[bytes] = []
        waits = 0

        def on_chunk(chunk: bytes) -> Any:
            nonlocal waits
            got.append(chunk)
            if len(got) % 5 == 1:  # the first chunk, then every fifth (a body may come in few)
                waits += 1
                return asyncio.sleep(0.001)  # a slow client: reading waits for this
            return None

        try:
            await (await _post(transport, upstream.url + "/s", {})).pump(on_chunk)
            whole = b"".join(got)
            seen: list[bytes] = []

            def stop_at_first(chunk: bytes) -> None:
                seen.append(chunk)
                raise StopPumping

            # The second answer stalls half-way: only stopping can end this pump.
            await asyncio.wait_for((await _post(transport, upstream.url + "/s", {})).pump(stop_at_first), 5)
            return whole, waits, len(seen)
        finally:
            await transport.aclose()

    whole, waits, stopped_after = asyncio.run(go())
    assert whole == payload
    assert waits >= 1
    assert stopped_after == 1
    assert upstream.wait_disconnect(5.0)  # stopping dropped the stalled connection


@pytest.mark.parametrize("trust_env", [False, True], ids=["http1", "aiohttp"])
def test_connect_error_is_502_without_secrets(trust_env: bool) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1beta/models/x:streamGenerateContent?key={SECRET}&alt=sse"

    async def go() -> None:
        transport = Transport(timeouts=Timeouts(connect=2), trust_env=trust_env)
        try:
            await _post(transport, url, {})
        finally:
            await transport.aclose()

    with pytest.raises(ProviderError) as info:
        asyncio.run(go())
    assert info.value.status == 502
    assert info.value.code == "server_error"
    # Both clients name the socket's own error (aiohttp wraps it in its ClientConnectorError).
    port = url.split(":")[2].split("/")[0]
    assert info.value.message == (
        f"Upstream http://127.0.0.1:{port}/v1beta/models/x:streamGenerateContent could not be reached "
        f"(ConnectionRefusedError: Connect call failed ('127.0.0.1', {port}))."
    )
    assert SECRET not in info.value.message and "key=" not in info.value.message


def test_idle_read_timeout_is_504(upstream: UpstreamMock) -> None:
    upstream.enqueue(stream_reply(b"event: a\ndata: {}\n\n" * 3, stall_after=10))

    async def go() -> bytes:
        transport = Transport(timeouts=Timeouts(read=0.3))
        got = b""
        try:
            resp = await _post(transport, upstream.url + "/s", {})
            async for chunk in resp.iter_chunks():
                got += chunk
        finally:
            await transport.aclose()
        return got

    with pytest.raises(ProviderError) as info:
        asyncio.run(go())
    assert info.value.status == 504
    assert "timeout" in info.value.message
    assert upstream.wait_disconnect()


def test_aclose_mid_stream_closes_the_socket(upstream: UpstreamMock) -> None:
    upstream.enqueue(stream_reply(b"event: a\ndata: {}\n\n" * 50, stall_after=40))

    async def go() -> None:
        transport = Transport()
        try:
            resp = await _post(transport, upstream.url + "/s", {})
            async for _ in resp.iter_chunks():
                break
            await resp.aclose()
            # The server notices the client left even though the pool stays open.
            assert await asyncio.to_thread(upstream.wait_disconnect, 5.0)
        finally:
            await transport.aclose()

    asyncio.run(go())
    assert upstream.disconnects == 1


def test_cancelling_the_reader_closes_the_socket(upstream: UpstreamMock) -> None:
    upstream.enqueue(stream_reply(b"event: a\ndata: {}\n\n" * 50, stall_after=40))

    async def go() -> None:
        transport = Transport()
        started = asyncio.Event()

        async def consume() -> None:
            resp = await _post(transport, upstream.url + "/s", {})
            try:
                async for _ in resp.iter_chunks():
                    started.set()
            finally:
                await resp.aclose()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(upstream.wait_disconnect, 5.0)
        await transport.aclose()

    asyncio.run(go())


def test_transport_works_across_event_loops(upstream: UpstreamMock) -> None:
    upstream.enqueue(json_reply({"ok": True}))
    transport = Transport()

    async def once() -> Any:
        resp = await _post(transport, upstream.url + "/y", {})
        return await resp.json()

    assert asyncio.run(once()) == {"ok": True}
    assert asyncio.run(once()) == {"ok": True}
    asyncio.run(transport.aclose())


def test_reprs_hide_secrets(upstream: UpstreamMock) -> None:
    upstream.enqueue(json_reply({}))

    async def go() -> str:
        transport = Transport()
        try:
            resp = await _post(transport, upstream.url + f"/z?key={SECRET}", {})
            text = repr(resp) + repr(transport)
            await resp.aclose()
            return text
        finally:
            await transport.aclose()

    text = asyncio.run(go())
    assert SECRET not in text
    assert "/z" in text


# ---------------------------------------------------------------------------------------- the mock


def test_mock_scripts_errors_then_success_and_repeats_last(upstream: UpstreamMock) -> None:
    upstream.enqueue(
        error_reply(503, {"error": {"message": "busy"}}),
        error_reply(429, None, headers={"retry-after": "2"}),
        stream_reply(b"data: 1\n\n"),
    )

    async def go() -> list[tuple[int, str | None, bytes]]:
        transport = Transport()
        try:
            out: list[tuple[int, str | None, bytes]] = []
            for _ in range(4):
                resp = await _post(transport, upstream.url + "/m", {"n": len(out)})
                out.append((resp.status, resp.headers.get("retry-after"), await resp.read()))
            return out
        finally:
            await transport.aclose()

    got = asyncio.run(go())
    assert [g[0] for g in got] == [503, 429, 200, 200]
    assert got[1][1] == "2"
    assert got[3][2] == b"data: 1\n\n"
    assert [r.json["n"] for r in upstream.requests] == [0, 1, 2, 3]


def test_mock_unscripted_request_is_500(upstream: UpstreamMock) -> None:
    async def go() -> int:
        transport = Transport()
        try:
            return (await _post(transport, upstream.url + "/m", {})).status
        finally:
            await transport.aclose()

    assert asyncio.run(go()) == 500


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        ("anthropic", b'event: ping\ndata: {"type":"ping"}\n\nevent: message\ndata: {"x":1}\n\n'),
        ("openai-responses", b'event: ping\ndata: {"type":"ping"}\n\nevent: message\ndata: {"x":1}\n\n'),
        ("openai-chat", b'data: {"type":"ping"}\n\ndata: {"x":1}\n\ndata: [DONE]\n\n'),
        ("gemini", b'data: {"type":"ping"}\r\n\r\ndata: {"x":1}\r\n\r\n'),
    ],
)
def test_encode_chunks_wire_formats(wire: str, expected: bytes) -> None:
    assert encode_chunks([{"type": "ping"}, {"x": 1}], wire) == expected


def test_fixture_reply_kinds_and_split_is_lossless() -> None:
    sse = fixture_reply("anthropic-messages__stop-reason-max-tokens__mirascope-mirascope.sse")
    split = fixture_reply(
        "anthropic-messages__stop-reason-max-tokens__mirascope-mirascope.sse", split=True, seed=5
    )
    assert b"".join(split.pieces()) == sse.body and len(split.pieces()) > 1
    chunks = fixture_reply("anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl")
    assert chunks.body.startswith(b"event: message_start\ndata: {")
    err = fixture_reply("anthropic-messages__http-401-authentication-error-body__mirascope-mirascope.json")
    assert err.status == 401 and err.content_type == "application/json"


# ---------------------------------------------------------------------------------------- errors


def _fixture_error(name: str, status: int, headers: dict[str, str] | None = None) -> ProviderError:
    return from_http(status, headers or {}, orjson.dumps(load_json(name)), upstream="Upstream")


@pytest.mark.parametrize(
    ("name", "status", "want_status", "want_code", "want_param"),
    [
        ("anthropic-messages__http-401-authentication-error-body__mirascope-mirascope.json", 401, 502,
         "upstream_authentication_error", None),
        ("anthropic-messages__http-404-not-found-error-body__mirascope-mirascope.json", 404, 404,
         "model_not_found", "model"),
        ("gemini__http-400-api-key-invalid-on-stream-endpoint__mirascope-mirascope.json", 400, 502,
         "upstream_authentication_error", None),
        ("gemini__http-404-model-not-found-on-stream-endpoint__mirascope-mirascope.json", 404, 404,
         "model_not_found", "model"),
        ("gemini__http-429-resource-exhausted-retry-info__vercel-ai.json", 429, 429,
         "rate_limit_exceeded", None),
        ("openai-chat__http-401-invalid-api-key-body__mirascope-mirascope.json", 401, 502,
         "upstream_authentication_error", None),
        ("openai-chat__http-404-model-not-found-body__mirascope-mirascope.json", 404, 404,
         "model_not_found", "model"),
        ("openai-responses__http-400-model-not-found-body__mirascope-mirascope.json", 400, 404,
         "model_not_found", "model"),
        ("openai-responses__http-error-body-insufficient-quota__vercel-ai.json", 429, 429,
         "insufficient_quota", None),
        ("openai-responses__http-error-body-unsupported-parameter-temperature__vercel-ai.json", 400, 400,
         "invalid_request_error", "temperature"),
        ("openai-responses__nonstream-http-400-invalid-temperature__pydantic-pydantic-ai.json", 400, 400,
         "decimal_below_min_value", "temperature"),
    ],
)  # fmt: skip
def test_recorded_error_bodies(
    name: str, status: int, want_status: int, want_code: str, want_param: str | None
) -> None:
    err = _fixture_error(name, status)
    assert (err.status, err.code, err.param) == (want_status, want_code, want_param)
    assert err.message


def test_gemini_retry_info_sets_retry_after() -> None:
    err = _fixture_error("gemini__http-429-resource-exhausted-retry-info__vercel-ai.json", 429)
    assert err.retry_after == pytest.approx(34.4)
    assert err.type == "rate_limit_error"


def test_upstream_auth_message_is_scrubbed() -> None:
    err = _fixture_error("openai-chat__http-401-invalid-api-key-body__mirascope-mirascope.json", 401)
    assert "invalid-*****2345" not in err.message
    assert "rejected the gateway's credentials" in err.message


@pytest.mark.parametrize(
    ("status", "body", "code", "out_status"),
    [
        (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
         "server_is_overloaded", 503),
        (503, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "The model is overloaded."}},
         "server_is_overloaded", 503),
        (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
         "rate_limit_exceeded", 429),
        (400, {"type": "error", "error": {"type": "invalid_request_error",
                                          "message": "prompt is too long: 210000 tokens > 200000 maximum"}},
         "context_length_exceeded", 400),
        (400, {"error": {"message": "This model's maximum context length is 128000 tokens.",
                         "type": "invalid_request_error", "code": "context_length_exceeded"}},
         "context_length_exceeded", 400),
        (400, {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                         "message": "The input token count (1200000) exceeds the maximum number of tokens "
                                    "allowed (1048576)."}},
         "context_length_exceeded", 400),
        (400, {"type": "error", "error": {"type": "invalid_request_error",
                                          "message": "Your credit balance is too low to access the API."}},
         "insufficient_quota", 429),
        (402, {"type": "error", "error": {"type": "billing_error", "message": "pay"}},
         "insufficient_quota", 429),
        (403, {"type": "error", "error": {"type": "permission_error", "message": "no"}},
         "upstream_authentication_error", 502),
        (500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
         "server_error", 502),
        (504, b"<html>gateway timeout</html>", "server_error", 504),
        (502, b"", "server_error", 502),
        (404, {"error": {"message": "Invalid URL (POST /v1/respnses)", "type": "invalid_request_error"}},
         "server_error", 502),
        (404, {"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}}, "server_error",
         502),
        (400, {"type": "error", "error": {"type": "invalid_request_error",
                                          "message": "messages: text content blocks must be non-empty"}},
         "invalid_request_error", 400),
        (422, {"detail": "bad"}, "invalid_request_error", 422),
        (400, [{"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "bad schema"}}],
         "invalid_request_error", 400),
    ],
)  # fmt: skip
def test_status_and_body_mapping(status: int, body: Any, code: str, out_status: int) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    err = from_http(status, {}, raw, upstream="api.example.com")
    assert (err.code, err.status) == (code, out_status)
    assert err.message


def test_4xx_message_is_upstream_message() -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too big"}}
    err = from_http(400, {}, orjson.dumps(body))
    assert err.message == "max_tokens: too big"
    assert err.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "0.25"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_retry_after_header_on_429_and_503() -> None:
    body = orjson.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "x"}})
    assert from_http(429, {"retry-after": "3"}, body).retry_after == 3.0
    assert from_http(529, {"retry-after-ms": "200"}, b"").retry_after == 0.2
    assert from_http(400, {"retry-after": "3"}, b"").retry_after is None


@pytest.mark.parametrize(
    ("payload", "code", "status"),
    [
        ({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
         "server_is_overloaded", 503),
        ({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
         "server_error", 500),
        ({"type": "error", "error": {"type": "rate_limit_error", "message": "x"}},
         "rate_limit_exceeded", 429),
        ({"error": {"message": "Tool use failed", "type": "invalid_request_error",
                    "code": "tool_use_failed"}},
         "tool_use_failed", 400),
        ({"error": {"message": "boom"}}, "server_error", 500),
    ],
)  # fmt: skip
def test_mid_stream_error_payloads(payload: Any, code: str, status: int) -> None:
    err = from_error_payload(payload)
    assert (err.code, err.status) == (code, status)


@pytest.mark.parametrize(
    "text",
    [
        "Incorrect API key provided: sk-proj-abcDEF123456789xyz.",
        f"bad key {SECRET} here",
        "key AIzaSyA-1234567890abcdefghijklmnopqrstu invalid",
        "Authorization: Bearer abc.def-ghi_jkl",
        "see https://x.googleapis.com/v1/models?key=zzzzzzzzzzzz&alt=sse",
        "token gsk_0123456789abcdefABCDEF leaked",
    ],
)
def test_scrub_removes_key_shapes(text: str) -> None:
    out = scrub(text)
    assert "[redacted]" in out
    for secret in ("sk-proj-abc", SECRET, "AIzaSyA", "abc.def", "zzzzzzzzzzzz", "gsk_0123"):
        assert secret not in out


def test_scrub_known_secret_and_plain_text_untouched() -> None:
    assert scrub("the key is hunter22!", ["hunter22"]) == "the key is [redacted]!"
    plain = "messages.1.content.0: text content blocks must be non-empty (sk- prefix is fine)"
    assert scrub(plain) == plain


def test_redact_url() -> None:
    assert redact_url("https://user:pw@h.example/p/a?key=1#f") == "https://h.example/p/a"
    assert redact_url("http://h/x") == "http://h/x"
