"""A hostile or careless upstream echoes the gateway's API key in its errors: the key never gets out.

For each HTTP back end, the upstream puts the key it was sent (a shape no pattern knows, so only the
configured secret catches it; raw and JSON-escaped) into an error before the first byte, an error
event mid-stream and a non-streamed answer. The raw bytes the client got, the stored Response, the
stored events (a resumed stream) and the log lines must not contain it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from gateways import stored, upstream  # noqa: F401 - fixtures, see pyproject
from soundness import assert_no_secret, assert_sound_stream, terminal_status
from wire import BACKENDS, anthropic_start, error_body, provider

from conftest import Gateway, decode_sse
from responses_gateway.providers.base import Provider
from upstream_mock import UpstreamMock, encode_chunks, error_reply, json_reply, stream_reply

JSON = dict[str, Any]
# No vendor's key shape: only the gateway's knowledge of its own secrets can catch it.
KEY = "Zq9/TEST+credential\\7781-qwv"
HEADER_SECRET = "hdr-secret-0c6e1f9a77d2"
SECRETS = [KEY, HEADER_SECRET]


def _echo(text: str = "upstream says") -> str:
    return f"{text}: your key {KEY} (header {HEADER_SECRET}) was rejected"


def backend(name: str, url: str) -> Provider:
    return provider(name, url, api_key=KEY, extra_headers={"x-org-token": HEADER_SECRET})


def _midstream(name: str) -> bytes:
    """Some text, then an error that echoes the key, in the provider's own wire format."""
    if name == "anthropic":
        return encode_chunks(
            [
                *anthropic_start(),
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
                {"type": "error", "error": {"type": "api_error", "message": _echo()}},
            ],
            "anthropic",
        )
    if name == "openai-chat":
        first = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": "Hi"}}],
        }
        return (
            b"data: " + orjson.dumps(first) + b"\n\n"
            b"event: error\ndata: "
            + orjson.dumps({"error": {"message": _echo(), "type": "server_error"}})
            + b"\n\n"
        )
    if name == "gemini":
        first = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}]}}]}
        error = {"error": {"code": 500, "status": "INTERNAL", "message": _echo()}}
        return encode_chunks([first, error], "gemini")
    response = {
        "id": "resp_up",
        "object": "response",
        "status": "in_progress",
        "model": "gpt",
        "output": [],
    }
    failed = dict(response, status="failed", error={"code": "server_error", "message": _echo("failed")})
    return encode_chunks(
        [
            {"type": "response.created", "sequence_number": 0, "response": response},
            {
                "type": "error",
                "sequence_number": 1,
                "code": "server_error",
                "message": _echo(),
                "param": None,
            },
            {"type": "response.failed", "sequence_number": 2, "response": failed},
        ],
        "openai-responses",
    )


def _stored_outputs(gw: Gateway, response_id: str) -> list[bytes]:
    """What the store gives back: the Response and its replayed events."""
    with httpx.Client(timeout=10) as client:
        got = client.get(gw.url(f"/v1/responses/{response_id}"))
        assert got.status_code == 200, got.text
        replay = client.get(gw.url(f"/v1/responses/{response_id}?stream=true&starting_after=0"))
        assert replay.status_code == 200, replay.text
    return [got.content, replay.content]


@pytest.mark.parametrize("name", BACKENDS)
def test_key_echoed_mid_stream_stays_secret(
    name: str, upstream: UpstreamMock, stored: Callable[[Provider], Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    upstream.reset([stream_reply(_midstream(name))])
    gw = stored(backend(name, upstream.url))
    with httpx.Client(timeout=10) as client:
        raw = client.post(
            gw.url("/v1/responses"), json={"model": gw.registry.names()[0], "input": "hi", "stream": True}
        )
    assert raw.status_code == 200, raw.text
    events = decode_sse(raw.content)
    assert_sound_stream(events)
    assert terminal_status(events) == "failed"
    assert "[redacted]" in events[-1]["response"]["error"]["message"]  # the message is kept, the key is not
    response_id = events[0]["response"]["id"]
    assert_no_secret(SECRETS, raw.content, *_stored_outputs(gw, response_id), caplog.text)


@pytest.mark.parametrize("name", BACKENDS)
def test_key_echoed_before_the_first_byte_stays_secret(
    name: str, upstream: UpstreamMock, stored: Callable[[Provider], Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    upstream.reset([error_reply(500, error_body(name, _echo()))])
    gw = stored(backend(name, upstream.url))
    with httpx.Client(timeout=10) as client:
        for stream in (True, False):
            raw = client.post(
                gw.url("/v1/responses"),
                json={"model": gw.registry.names()[0], "input": "hi", "stream": stream},
            )
            assert raw.status_code >= 500, raw.text
            assert raw.json()["error"]["message"]
            assert_no_secret(SECRETS, raw.content)
    assert_no_secret(SECRETS, caplog.text)


@pytest.mark.parametrize("name", ["openai-chat", "openai"])
def test_key_in_a_non_streamed_failure_stays_secret(
    name: str, upstream: UpstreamMock, stored: Callable[[Provider], Gateway], caplog: pytest.LogCaptureFixture
) -> None:
    """A server that ignores ``stream`` and answers a whole body whose error echoes the key."""
    caplog.set_level(logging.DEBUG)
    failed = {
        "id": "resp_up",
        "object": "response",
        "status": "failed",
        "model": "gpt",
        "output": [],
        "error": {"code": "server_error", "message": _echo()},
    }
    body = failed if name == "openai" else error_body(name, _echo())
    upstream.reset([json_reply(body)])
    gw = stored(backend(name, upstream.url))
    with httpx.Client(timeout=10) as client:
        raw = client.post(gw.url("/v1/responses"), json={"model": gw.registry.names()[0], "input": "hi"})
    outputs: list[Any] = [raw.content, caplog.text]
    if raw.status_code == 200:
        outputs += _stored_outputs(gw, raw.json()["id"])
    assert_no_secret(SECRETS, *outputs)
