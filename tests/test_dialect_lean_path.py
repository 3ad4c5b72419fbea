"""The Chat Completions and Messages streams on the push relay and the lean body path
(``frontends.DialectStream``), held to the path they replace: byte for byte the same stream whether
the chunks go out through the lean writer or the ASGI ``send``, and whether the upstream is read by
push or by the provider's yields; then the stream read through the vendors' SDKs.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import anthropic
import openai
import orjson
import pytest

from conftest import Gateway, start_gateway
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.server import chat_completions, http_protocol, messages
from test_lean_body_path import read_response
from test_push_relay import chat_body
from upstream_mock import UpstreamMock, stream_reply

PIECES = [f"w{i} " for i in range(40)]


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def lean() -> list[int]:
    """Chunks the lean writer wrote."""
    return [0]


@pytest.fixture(scope="module")
def served(upstream: UpstreamMock, lean: list[int]) -> Iterator[Gateway]:
    original = http_protocol.BodyWriter.__call__

    def counted(self: http_protocol.BodyWriter, body: bytes) -> bool:
        done = original(self, body)
        lean[0] += done
        return done

    http_protocol.BodyWriter.__call__ = counted  # type: ignore[method-assign]
    chat = OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-lean", upstream_model="m")
    chat.name = "chat"
    gw = start_gateway([chat], keepalive="off", api_keys=("sk-gw",))
    yield gw
    gw.stop()
    http_protocol.BodyWriter.__call__ = original  # type: ignore[method-assign]


def _request(path: str, body: dict[str, object]) -> bytes:
    data = orjson.dumps(body)
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-gw\r\n"
        b"x-api-key: sk-gw\r\nanthropic-version: 2023-06-01\r\nContent-Length: %d\r\n\r\n%s"
        % (path.encode(), len(data), data)
    )


DIALECTS = {
    "chat": (
        "/v1/chat/completions",
        {
            "model": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    "messages": (
        "/v1/messages",
        {"model": "chat", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    ),
}


def _normalized(data: bytes) -> bytes:
    """What differs between two runs of one stream blanked: ids and times."""
    data = re.sub(rb"\b(chatcmpl-|resp_|msg_)[0-9a-f]{24}\b", rb"\1X", data)
    data = re.sub(rb'"(created|created_at)":\d+', rb'"\1":0', data)
    return re.sub(rb"\r\ndate: [^\r]*", b"", data)


def _stream(upstream: UpstreamMock, port: int, dialect: str) -> tuple[bytes, list[bytes]]:
    upstream.reset([stream_reply(chat_body(PIECES), split=True, seed=5, max_piece=90, delay=0.002)])
    path, body = DIALECTS[dialect]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_request(path, body))
        head, chunks = read_response(sock, bytearray())
    return _normalized(head), [_normalized(c) for c in chunks]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_lean_push_and_asgi_yield_paths_give_the_same_bytes(
    upstream: UpstreamMock, served: Gateway, lean: list[int], dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = lean[0]
    lean_head, lean_chunks = _stream(upstream, served.port, dialect)
    assert lean[0] - before >= 10  # the deltas went out the lean way
    for chunk in lean_chunks:
        assert chunk.endswith(b"\n\n")  # every chunk is whole SSE frames

    # The writer not offered: every chunk through the ASGI send.
    with monkeypatch.context() as patch:
        patch.setattr(chat_completions, "body_writer", lambda scope: None)
        patch.setattr(messages, "body_writer", lambda scope: None)
        before = lean[0]
        plain_head, plain_chunks = _stream(upstream, served.port, dialect)
        assert lean[0] == before
    assert plain_head == lean_head
    assert b"".join(plain_chunks) == b"".join(lean_chunks)

    # The upstream read by the provider's yields (no push): the task-side path.
    with monkeypatch.context() as patch:
        patch.setattr(OpenAIChatProvider, "push_relay", False)
        yield_head, yield_chunks = _stream(upstream, served.port, dialect)
    assert yield_head == lean_head
    assert b"".join(yield_chunks) == b"".join(lean_chunks)


def test_the_sdks_read_the_lean_streams(upstream: UpstreamMock, served: Gateway, lean: list[int]) -> None:
    text = "".join(PIECES)
    upstream.reset([stream_reply(chat_body(PIECES), split=True, seed=6, max_piece=90, delay=0.002)])
    before = lean[0]
    client = openai.OpenAI(base_url=served.url("/v1"), api_key="sk-gw", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(PIECES)
    assert lean[0] - before >= 10

    upstream.reset([stream_reply(chat_body(PIECES), split=True, seed=7, max_piece=90, delay=0.002)])
    before = lean[0]
    anth = anthropic.Anthropic(base_url=served.origin, api_key="sk-gw", max_retries=0)
    with anth.messages.stream(
        model="chat", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        assert "".join(stream.text_stream) == text
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn"
    assert lean[0] - before >= 10
